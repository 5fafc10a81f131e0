//! docker/Dockerfile and docker/compose.yaml, checked without a container engine (none runs on our
//! machines). The compose file is validated by `compose-check` (docker/compose-check: compose-go,
//! the loader `docker compose config` itself uses, with the Compose Specification JSON schema),
//! built by scripts/test.sh into target/compose-check; that test is ignored without it:
//!   COMPOSE_CHECK=target/compose-check cargo test -p e2e --test docker_compose -- --include-ignored
//! The rest parse the files and check what the demo relies on: pinned images, adapter
//! healthchecks, istiod's start order and sources, one non-root image per adapter, and the
//! seed scripts' syntax (bash -n / sh -n).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

use e2e::run_ok;

const MCP_PORT: u16 = 15051;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn compose_path() -> PathBuf {
    repo().join("docker/compose.yaml")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// docker/compose.yaml with YAML merge keys (`<<: *adapter`) applied, as Compose reads it.
fn compose() -> Value {
    let mut v: Value = serde_yaml::from_str(&read(&compose_path())).expect("compose.yaml parses");
    v.apply_merge().expect("merge keys");
    v
}

fn services(c: &Value) -> Vec<(String, &Value)> {
    c["services"]
        .as_mapping()
        .expect("services")
        .iter()
        .map(|(k, v)| (k.as_str().expect("service name").to_string(), v))
        .collect()
}

/// The compose services that run an adapter.
fn adapter_services(c: &Value) -> Vec<String> {
    services(c)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("adapter-"))
        .collect()
}

/// The adapters of the workspace (its `adapter-*` members).
fn workspace_adapters() -> BTreeSet<String> {
    let cargo: toml_lite::Doc = toml_lite::Doc(read(&repo().join("Cargo.toml")));
    cargo
        .members()
        .into_iter()
        .filter(|m| m.starts_with("adapter-"))
        .collect()
}

/// Just enough of Cargo.toml: the workspace members and `rust-version`.
mod toml_lite {
    pub struct Doc(pub String);
    impl Doc {
        pub fn members(&self) -> Vec<String> {
            let line = self
                .0
                .lines()
                .find(|l| l.trim_start().starts_with("members"))
                .expect("workspace members line");
            line.split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        }
        pub fn rust_version(&self) -> String {
            let line = self
                .0
                .lines()
                .find(|l| l.trim_start().starts_with("rust-version"))
                .expect("rust-version in Cargo.toml");
            line.split('"').nth(1).expect("quoted version").to_string()
        }
    }
}

/// An image reference is pinned: a digest, or a tag that is not `latest`.
fn pinned(image: &str) -> Result<(), String> {
    if image.contains("@sha256:") {
        return Ok(());
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        None => Err(format!("{image}: no tag (means `latest`)")),
        Some((_, "")) => Err(format!("{image}: empty tag")),
        Some((_, "latest")) => Err(format!("{image}: `latest` is not a pin")),
        Some(_) if image.contains('$') => Err(format!("{image}: tag from a variable")),
        Some(_) => Ok(()),
    }
}

#[test]
fn pin_rule_rejects_unpinned_images() {
    assert!(pinned("zookeeper:3.9.3").is_ok());
    assert!(pinned("registry.k8s.io/etcd:3.5.21-0").is_ok());
    assert!(pinned("localhost:5000/x@sha256:abc").is_ok());
    assert!(pinned("zookeeper").is_err());
    assert!(pinned("zookeeper:latest").is_err());
    assert!(
        pinned("localhost:5000/zookeeper").is_err(),
        "a port is not a tag"
    );
    assert!(pinned("rust:${V}-slim").is_err());
}

#[test]
fn every_compose_image_is_pinned() {
    let c = compose();
    for (name, s) in services(&c) {
        let image = s["image"]
            .as_str()
            .unwrap_or_else(|| panic!("service {name} has no image (a built one needs a tag too)"));
        if let Err(e) = pinned(image) {
            panic!("service {name}: {e}");
        }
    }
}

#[test]
fn compose_runs_the_demo_adapters_as_built_by_the_dockerfile() {
    let c = compose();
    let adapters = adapter_services(&c);
    for want in ["adapter-consul", "adapter-zookeeper", "adapter-file"] {
        assert!(
            adapters.contains(&want.to_string()),
            "{want} missing from compose: {adapters:?}"
        );
    }
    let stages = dockerfile_stages();
    for a in &adapters {
        let s = &c["services"][a.as_str()];
        // The same image name as deploy/kubernetes, built from this Dockerfile's target.
        let name = a.trim_start_matches("adapter-");
        assert_eq!(
            s["image"].as_str(),
            Some(format!("ghcr.io/example/mcp-adapter-{name}:0.1.0").as_str()),
            "{a}: image name as in deploy/kubernetes"
        );
        let manifest = read(&repo().join(format!("deploy/kubernetes/{a}.yaml")));
        assert!(
            manifest.contains(&format!("image: ghcr.io/example/mcp-adapter-{name}:0.1.0")),
            "deploy/kubernetes/{a}.yaml uses another image"
        );
        assert_eq!(
            s["build"]["dockerfile"].as_str(),
            Some("docker/Dockerfile"),
            "{a}"
        );
        let target = s["build"]["target"]
            .as_str()
            .unwrap_or_else(|| panic!("{a}: build.target"));
        assert!(
            stages.iter().any(|st| st.name == target),
            "{a}: build target {target} is no stage of docker/Dockerfile"
        );
    }
}

#[test]
fn every_adapter_service_has_a_healthcheck() {
    let c = compose();
    for a in adapter_services(&c) {
        let hc = &c["services"][a.as_str()]["healthcheck"];
        assert!(hc.is_mapping(), "{a}: no healthcheck");
        assert_ne!(
            hc["disable"],
            Value::Bool(true),
            "{a}: healthcheck disabled"
        );
        let test: Vec<&str> = hc["test"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{a}: healthcheck.test is not a list"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            test.first() == Some(&"CMD") && test.len() > 1,
            "{a}: healthcheck.test must be [CMD, ...] (distroless has no shell): {test:?}"
        );
        // The image has no curl/wget: the check is mcpctl against the adapter's own MCP port.
        assert!(
            test[1].ends_with("/mcpctl")
                && test.contains(&format!("xds://127.0.0.1:{MCP_PORT}").as_str()),
            "{a}: healthcheck is not mcpctl against the MCP port: {test:?}"
        );
    }
}

#[test]
fn istiod_starts_after_every_adapter_is_healthy_and_the_seeds_finished() {
    let c = compose();
    let deps = &c["services"]["istiod"]["depends_on"];
    assert!(
        deps.is_mapping(),
        "istiod depends_on must be the long form with conditions"
    );
    for a in adapter_services(&c) {
        assert_eq!(
            deps[a.as_str()]["condition"].as_str(),
            Some("service_healthy"),
            "istiod must wait for {a} to be healthy (a source down at its start makes it exit)"
        );
    }
    let seeds: Vec<String> = services(&c)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("seed"))
        .collect();
    assert!(!seeds.is_empty(), "no seed service");
    for s in seeds {
        assert_eq!(
            deps[s.as_str()]["condition"].as_str(),
            Some("service_completed_successfully"),
            "istiod must wait for {s} to finish"
        );
    }
}

#[test]
fn istiod_mesh_config_lists_every_adapter() {
    let c = compose();
    let istiod = &c["services"]["istiod"];
    let mesh_target = istiod["command"]
        .as_sequence()
        .expect("istiod command")
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--meshConfig="))
        .expect("istiod --meshConfig=PATH")
        .to_string();
    let config = istiod["configs"]
        .as_sequence()
        .expect("istiod configs")
        .iter()
        .find(|cf| cf["target"].as_str() == Some(mesh_target.as_str()))
        .unwrap_or_else(|| panic!("no config mounted at {mesh_target}"));
    let source = config["source"].as_str().expect("config source");
    let content = c["configs"][source]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("configs.{source}.content"));
    let mesh: Value = serde_yaml::from_str(content).expect("mesh config parses");
    let got: BTreeSet<String> = mesh["configSources"]
        .as_sequence()
        .expect("configSources")
        .iter()
        .map(|s| s["address"].as_str().expect("address").to_string())
        .collect();
    let want: BTreeSet<String> = adapter_services(&c)
        .iter()
        .map(|a| format!("xds://{a}:{MCP_PORT}"))
        .collect();
    assert_eq!(got, want, "configSources vs the adapter services");
    for a in &want {
        assert!(
            content.contains(&format!("\"{a}\"")),
            "{a} must be quoted in the mesh config"
        );
    }
}

#[test]
fn seed_scripts_are_valid_shell() {
    let mut n = 0;
    for dir in ["docker/seed", "docker/kube"] {
        for e in std::fs::read_dir(repo().join(dir)).expect("read dir") {
            let p = e.expect("entry").path();
            if p.extension().is_none_or(|x| x != "sh") {
                continue;
            }
            let shebang = read(&p).lines().next().unwrap_or("").to_string();
            let shell = if shebang.contains("bash") {
                "bash"
            } else {
                "sh"
            };
            run_ok(
                Command::new(shell).arg("-n").arg(&p),
                &format!("{shell} -n {}", p.display()),
            );
            n += 1;
        }
    }
    assert!(n >= 2, "found only {n} scripts");
}

#[derive(Debug)]
struct Stage {
    base: String,
    name: String,
    lines: Vec<String>,
}

/// docker/Dockerfile's stages: FROM base AS name, and the instructions under it (continuation
/// lines joined, comments dropped).
fn dockerfile_stages() -> Vec<Stage> {
    let text = read(&repo().join("docker/Dockerfile"));
    let mut logical = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        let t = l.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            cur.push_str(body);
            cur.push(' ');
        } else {
            cur.push_str(t);
            logical.push(std::mem::take(&mut cur));
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for l in logical {
        let mut words = l.split_whitespace();
        if words.next().is_some_and(|w| w.eq_ignore_ascii_case("FROM")) {
            let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
            let base = rest.first().expect("FROM image").to_string();
            let name = match rest.as_slice() {
                [_, as_, n] if as_.eq_ignore_ascii_case("AS") => n.to_string(),
                _ => String::new(),
            };
            stages.push(Stage {
                base,
                name,
                lines: vec![],
            });
        } else if let Some(s) = stages.last_mut() {
            s.lines.push(l);
        }
    }
    stages
}

fn instr<'a>(s: &'a Stage, word: &str) -> Vec<&'a str> {
    s.lines
        .iter()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case(word))
        })
        .map(|l| l[word.len()..].trim())
        .collect()
}

#[test]
fn dockerfile_builds_once_and_yields_one_nonroot_image_per_adapter() {
    let stages = dockerfile_stages();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    for s in &stages {
        // A base that is an earlier stage needs no pin.
        if !names.contains(&s.base.as_str()) {
            if let Err(e) = pinned(&s.base) {
                panic!("FROM {}: {e}", s.base);
            }
        }
    }

    // The builder: the workspace's rust-version, every binary built once.
    let rust_version = toml_lite::Doc(read(&repo().join("Cargo.toml"))).rust_version();
    let builders: Vec<&Stage> = stages
        .iter()
        .filter(|s| s.base.starts_with("rust:"))
        .collect();
    assert_eq!(builders.len(), 1, "one Rust build stage: {names:?}");
    let builder = builders[0];
    let tag = builder.base.split_once(':').expect("rust tag").1;
    let image_version = tag.split('-').next().unwrap_or(tag);
    assert_eq!(
        image_version, rust_version,
        "builder {} vs the workspace rust-version {rust_version}",
        builder.base
    );
    assert!(
        instr(builder, "RUN")
            .iter()
            .any(|r| r.contains("cargo build --release --locked --workspace --bins")),
        "the builder must build every binary once"
    );

    // One shared runtime stage (distroless, nonroot, mcpctl, health check, listen addresses)
    // and one final stage per adapter of the workspace on top of it, and no other stage.
    let finals: Vec<&Stage> = stages
        .iter()
        .filter(|s| s.name != builder.name && names.contains(&s.base.as_str()))
        .collect();
    let final_names: BTreeSet<String> = finals.iter().map(|s| s.name.clone()).collect();
    assert_eq!(final_names, workspace_adapters(), "one target per adapter");
    let runtimes: BTreeSet<&str> = finals.iter().map(|s| s.base.as_str()).collect();
    assert_eq!(runtimes.len(), 1, "one shared runtime stage: {runtimes:?}");
    let runtime = stages
        .iter()
        .find(|s| runtimes.contains(s.name.as_str()))
        .expect("the runtime stage");
    assert!(
        runtime.base.starts_with("gcr.io/distroless/"),
        "runtime on distroless: {}",
        runtime.base
    );
    assert_eq!(
        stages.len(),
        finals.len() + 2,
        "only the builder, the runtime and the adapters' stages: {names:?}"
    );
    for s in finals {
        let n = &s.name;
        // What the image holds: the runtime's instructions, then the adapter's own.
        let image = Stage {
            name: n.clone(),
            base: runtime.base.clone(),
            lines: runtime.lines.iter().chain(&s.lines).cloned().collect(),
        };
        let s = &image;
        let copies = instr(s, "COPY").join(" ");
        assert!(
            copies.contains(&format!("--from={}", builder.name))
                && copies.contains(&format!("/{n}"))
                && copies.contains("/mcpctl"),
            "{n}: must copy its adapter and mcpctl from the builder: {copies}"
        );
        let user = instr(s, "USER");
        assert!(
            user.last()
                .is_some_and(|u| u.starts_with("65532") || u.starts_with("nonroot")),
            "{n}: USER must be 65532/nonroot: {user:?}"
        );
        let hc = instr(s, "HEALTHCHECK");
        assert!(
            hc.len() == 1 && hc[0].contains("CMD [\"/usr/local/bin/mcpctl\""),
            "{n}: HEALTHCHECK (exec form, mcpctl: the image has no shell or curl): {hc:?}"
        );
        let ep = instr(s, "ENTRYPOINT");
        assert_eq!(
            ep.last().copied(),
            Some(format!("[\"/usr/local/bin/{n}\"]").as_str()),
            "{n}: ENTRYPOINT"
        );
        let env = instr(s, "ENV").join(" ");
        assert!(
            env.contains(&format!("MCP_LISTEN=0.0.0.0:{MCP_PORT}"))
                && env.contains("MCP_ADMIN_LISTEN=0.0.0.0:15052"),
            "{n}: must listen on 0.0.0.0 in the container: {env}"
        );
        let expose = instr(s, "EXPOSE").join(" ");
        assert!(
            expose.contains(&MCP_PORT.to_string()) && expose.contains("15052"),
            "{n}: EXPOSE {expose}"
        );
    }
}

/// Runs docker/compose-check (compose-go: the Compose Specification schema plus the loader's own
/// checks) on docker/compose.yaml, and on broken copies to show it does reject.
#[test]
#[ignore = "needs compose-check: (cd docker/compose-check && go build -o ../../target/compose-check .); set COMPOSE_CHECK"]
fn compose_file_is_valid_per_the_compose_specification() {
    let check = std::env::var("COMPOSE_CHECK").expect("COMPOSE_CHECK=path to compose-check");
    let run = |file: &Path| {
        Command::new(&check)
            .arg(file)
            .output()
            .unwrap_or_else(|e| panic!("run {check}: {e}"))
    };
    let out = run(&compose_path());
    assert!(
        out.status.success(),
        "docker/compose.yaml is invalid: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The normalized model: what Compose would run.
    let model: Value = serde_yaml::from_slice(&out.stdout).expect("normalized model");
    for a in adapter_services(&compose()) {
        assert_eq!(
            model["services"]["istiod"]["depends_on"][a.as_str()]["condition"].as_str(),
            Some("service_healthy"),
            "normalized istiod depends_on {a}"
        );
        assert!(
            model["services"][a.as_str()]["healthcheck"]["test"].is_sequence(),
            "normalized {a} healthcheck"
        );
    }

    // The validator rejects what it should: copies in docker/ (relative paths resolve the same).
    let original = read(&compose_path());
    let broken = [
        (
            "an unknown service key",
            original.replace(
                "    image: zookeeper:3.9.3\n    ports:",
                "    image: zookeeper:3.9.3\n    helthcheck: {}\n    ports:",
            ),
        ),
        (
            "a bad depends_on condition",
            original.replacen("condition: service_healthy", "condition: service_ready", 1),
        ),
        (
            "depends_on an unknown service",
            original.replace(
                "seed-zookeeper: {condition: service_completed_successfully}",
                "seed-zk: {condition: service_completed_successfully}",
            ),
        ),
    ];
    for (what, text) in broken {
        assert_ne!(text, original, "{what}: the replacement did not apply");
        let tmp = repo().join(format!("docker/.compose-check-{}.yaml", std::process::id()));
        std::fs::write(&tmp, text).expect("write broken copy");
        let out = run(&tmp);
        let _ = std::fs::remove_file(&tmp);
        assert!(!out.status.success(), "compose-check accepted {what}");
        eprintln!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
}
