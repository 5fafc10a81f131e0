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

/// `unsafe` is denied in every crate (the workspace's lints) and allowed by one module only, the
/// counting global allocator, which cannot be written without it, and by its bench, which calls
/// it directly.
#[test]
fn only_the_counting_allocator_and_its_bench_allow_unsafe_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut files = Vec::new();
    rust_files(root, &mut files);
    assert!(files.len() > 100, "{} files found", files.len());
    let mut allowing: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .expect("read a source file")
                .contains(concat!("allow(", "unsafe_code)"))
        })
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
