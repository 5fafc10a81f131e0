//! The workspace's layers, as Cargo resolves them: what each crate may never depend on
//! (ARCHITECTURE.md, "Crates and layers"), and no test support in a shipped binary.
//!
//! The compiler already refuses an import that runs back up (a crate cannot name one it does not
//! depend on); these tests keep the manifests from quietly adding such a dependency, direct or
//! through another crate.

use std::collections::BTreeSet;
use std::process::Command;

/// Every package in `package`'s normal-dependency tree, by name (features as Cargo resolves them
/// when only `package` is built, as `cargo build -p package` does).
fn tree(package: &str, edges: &str) -> String {
    tree_to(package, edges, None)
}

/// [`tree`], `depth` levels deep (1: what `package` names itself).
fn tree_to(package: &str, edges: &str, depth: Option<u32>) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let depth = depth.map(|d| d.to_string());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "--locked", "-p", package, "-e", edges])
        .args(["--prefix", "none"])
        .args(depth.iter().flat_map(|d| ["--depth", d.as_str()]))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn packages(package: &str) -> BTreeSet<String> {
    tree(package, "normal")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn assert_never(package: &str, forbidden: &[&str]) {
    let deps = packages(package);
    assert!(
        deps.contains(package) && deps.len() > 5,
        "{package}: not a tree: {deps:?}"
    );
    let found: Vec<&&str> = forbidden.iter().filter(|f| deps.contains(**f)).collect();
    assert!(found.is_empty(), "{package} depends on {found:?}");
}

/// Network, gRPC and flags are above the core: `grpc` off, `proto` is messages only.
#[test]
fn the_core_has_no_grpc_kube_flags_or_http() {
    assert_never(
        "mcp-core",
        &[
            "tonic",
            "hyper",
            "h2",
            "kube",
            "kube-client",
            "k8s-openapi",
            "clap",
            "reqwest",
            "axum",
            "envoy-types",
            "mcp-server",
            "mcp-kube-output",
            "mcp-runtime",
        ],
    );
}

#[test]
fn the_server_knows_no_runtime_kube_or_flags() {
    assert_never(
        "mcp-server",
        &[
            "mcp-runtime",
            "mcp-kube-output",
            "kube",
            "kube-client",
            "clap",
            "reqwest",
        ],
    );
}

#[test]
fn the_kube_output_knows_no_server_runtime_or_flags() {
    assert_never(
        "mcp-kube-output",
        &[
            "mcp-runtime",
            "mcp-server",
            "tonic",
            "clap",
            "axum",
            "reqwest",
        ],
    );
}

/// Every adapter binary of the workspace.
const ADAPTERS: [&str; 6] = [
    "adapter-file",
    "adapter-consul",
    "adapter-zookeeper",
    "adapter-eureka",
    "adapter-kube",
    "adapter-nacos",
];

/// `testing` (the registry a test drives, default flags for tests) is never in what ships.
#[test]
fn no_binary_carries_test_support() {
    for bin in ADAPTERS.iter().chain(&["mcpctl"]) {
        let features = tree(bin, "features,no-dev");
        assert!(
            features.contains("mcp-core feature \"default\""),
            "{bin}: not a feature tree:\n{features}"
        );
        let testing: Vec<&str> = features
            .lines()
            .filter(|l| l.contains("feature \"testing\""))
            .collect();
        assert!(testing.is_empty(), "{bin} builds with {testing:?}");
    }
}

/// The packages `package` names in its manifest (normal dependencies).
fn direct(package: &str) -> BTreeSet<String> {
    tree_to(package, "normal", Some(1))
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|p| *p != package)
        .map(str::to_string)
        .collect()
}

/// Adapters never build protobufs (the core encodes every resource): none names the MCP server,
/// the message crate or Envoy's types among its dependencies (the runtime brings the server).
/// adapter-nacos links tonic for Nacos' own gRPC protocol, with its three messages declared in
/// its `wire.rs`, never Istio's.
#[test]
fn adapters_build_no_protobufs() {
    for bin in ADAPTERS {
        let deps = direct(bin);
        assert!(deps.contains("mcp-runtime"), "{bin}: {deps:?}");
        let found: Vec<&str> = ["proto", "envoy-types", "mcp-server"]
            .into_iter()
            .filter(|f| deps.contains(*f))
            .collect();
        assert!(found.is_empty(), "{bin} depends on {found:?} itself");
    }
}

/// Every `.rs` file under `dir`, but build outputs and hidden directories.
fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a workspace directory") {
        let path = entry.expect("directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The lint this file guards, spelled in two parts so that this file's own text never reads as
/// an attribute naming it.
const UNSAFE_CODE: &str = concat!("unsafe", "_code");

/// Whether `text` has a lint attribute that lets `unsafe_code` through where the workspace
/// denies it: `allow`, `expect` or `warn` with it anywhere in its list, alone or beside other
/// lints or a `reason`, also inside a `cfg_attr` (the spellings are in the test below).
fn lowers_unsafe_code(text: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    ["allow", "expect", "warn"].iter().any(|level| {
        text.match_indices(level).any(|(at, _)| {
            if text[..at].chars().next_back().is_some_and(ident) {
                return false;
            }
            let rest = text[at + level.len()..].trim_start();
            let Some(list) = rest.strip_prefix('(') else {
                return false;
            };
            // The list up to its closing parenthesis (lints have none inside).
            let list = list.split(')').next().unwrap_or_default();
            list.split(',').any(|item| item.trim() == UNSAFE_CODE)
        })
    })
}

#[test]
fn a_lowered_unsafe_code_is_seen_in_any_spelling() {
    let l = UNSAFE_CODE;
    for lowered in [
        format!("#![allow({l})]"),
        format!("#[allow(dead_code, {l})]"),
        format!("#[allow(\n    dead_code,\n    {l},\n)]"),
        format!("#![expect({l}, reason = \"an allocator\")]"),
        format!("#![warn({l})]"),
        format!("#![cfg_attr(test, allow({l}))]"),
        format!("#[allow ({l})]"),
    ] {
        assert!(lowers_unsafe_code(&lowered), "{lowered}");
    }
    for kept in [
        format!("#![deny({l})]"),
        format!("#![forbid({l})]"),
        format!("#[allow(dead_code)] fn {l}() {{}}"),
        format!("#[allow(not_{l})]"),
        format!("#[disallow({l})]"),
        "#[allow(dead_code)]".to_string(),
    ] {
        assert!(!lowers_unsafe_code(&kept), "{kept}");
    }
}

/// `unsafe` is denied in every crate (the workspace's lints) and allowed by one module only, the
/// counting global allocator, which cannot be written without it, and by its bench, which calls
/// it directly.
#[test]
fn only_the_counting_allocator_and_its_bench_allow_unsafe_code() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(root, &mut files);
    assert!(files.len() > 100, "{} files found", files.len());
    let mut allowing: Vec<String> = files
        .iter()
        .filter(|f| lowers_unsafe_code(&std::fs::read_to_string(f).expect("read a source file")))
        .map(|f| f.strip_prefix(root).unwrap_or(f).display().to_string())
        .collect();
    allowing.sort();
    assert_eq!(
        allowing,
        [
            "mcp-runtime/benches/heap_count.rs",
            "mcp-runtime/src/heap.rs"
        ]
    );
}

fn workspace_root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
}

/// A manifest's keys with their values as written, each under its full dotted name
/// (`[workspace.lints.rust]` `unsafe_code = "deny"` is `workspace.lints.rust.unsafe_code` ->
/// `"deny"`; an inline table's keys are spelled out: `lints = { workspace = true }` is
/// `lints.workspace` -> `true`). Enough TOML for Cargo's manifests here (one key a line; no
/// `=` inside values but an inline table's).
fn manifest_keys(text: &str) -> BTreeSet<(String, String)> {
    let name = |k: &str| -> String {
        k.split('.')
            .map(|p| p.trim().trim_matches('"'))
            .collect::<Vec<_>>()
            .join(".")
    };
    let mut table = String::new();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or_default().trim();
        if line.starts_with('#') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            table = name(header.trim_start_matches('[').trim_end_matches(']'));
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = [table.as_str(), &name(key)]
            .iter()
            .filter(|p| !p.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(".");
        let value = value.trim();
        match value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
            Some(inline) => {
                for (k, v) in inline.split(',').filter_map(|kv| kv.split_once('=')) {
                    out.insert((format!("{key}.{}", name(k)), v.trim().to_string()));
                }
            }
            None => {
                out.insert((key, value.to_string()));
            }
        }
    }
    out
}

/// The value of `key` in `keys`, if set.
fn value<'a>(keys: &'a BTreeSet<(String, String)>, key: &str) -> Option<&'a str> {
    keys.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn manifest_keys_read_every_spelling_of_a_lint() {
    let keys = manifest_keys(
        "[package]\nname = \"x\" # a comment\n\n[lints]\nworkspace = true\n\
         [workspace.lints.rust]\nunsafe_code = { level = \"deny\", priority = -1 }\n",
    );
    assert_eq!(value(&keys, "package.name"), Some("\"x\""));
    assert_eq!(value(&keys, "lints.workspace"), Some("true"));
    assert_eq!(
        value(&keys, "workspace.lints.rust.unsafe_code.level"),
        Some("\"deny\"")
    );
    let keys = manifest_keys("lints = { workspace = true }\n");
    assert_eq!(value(&keys, "lints.workspace"), Some("true"));
    let keys = manifest_keys("lints.workspace = false\n");
    assert_eq!(value(&keys, "lints.workspace"), Some("false"));
}

/// What [`only_the_counting_allocator_and_its_bench_allow_unsafe_code`] leans on: the workspace
/// itself denies (or forbids) `unsafe_code`, and every member of the workspace (as Cargo lists
/// them) takes the workspace's lints, so that a crate without `[lints] workspace = true` is not
/// a place where `unsafe` compiles with no attribute at all.
#[test]
fn every_crate_takes_the_workspace_lints_which_deny_unsafe_code() {
    let root = workspace_root();
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let keys = manifest_keys(&text);
    let lint = format!("workspace.lints.rust.{UNSAFE_CODE}");
    let level = value(&keys, &lint).or_else(|| value(&keys, &format!("{lint}.level")));
    assert!(
        matches!(level, Some("\"deny\"" | "\"forbid\"")),
        "{lint} is {level:?} in Cargo.toml, not \"deny\" or \"forbid\""
    );

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--offline", "--locked", "--no-deps"])
        .args(["--format-version", "1"])
        .current_dir(root)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let manifests: Vec<&str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(id)))
        .filter_map(|p| p["manifest_path"].as_str())
        .collect();
    assert_eq!(manifests.len(), members.len(), "{members:?}");
    assert!(manifests.len() >= 13, "{manifests:?}");
    let outside: Vec<&str> = manifests
        .iter()
        .filter(|m| {
            let text = std::fs::read_to_string(m).expect("a member's manifest");
            value(&manifest_keys(&text), "lints.workspace") != Some("true")
        })
        .copied()
        .collect();
    assert!(
        outside.is_empty(),
        "crates without `[lints] workspace = true`: {outside:?}"
    );
}
