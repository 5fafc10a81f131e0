//! The project's images and its compose demo, run by a real container engine (Debian's podman):
//! the images are built from `docker/Dockerfile` and `docker/Dockerfile.eureka` as users get them
//! (`tests/containers/build-images.sh`), on stand-ins for the upstream images
//! (`tests/containers/build.sh`), and `docker/compose.yaml` is brought up by Docker Compose v2.
//!
//! Every test that starts a container runs in a network namespace of its own and one at a time
//! (they share podman's store and its DNS server, which lives in one namespace).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use e2e::compose::Compose;
use e2e::kube::KubeApiServer;
use e2e::podman::{image_files, inspect_image, podman_ok, repo, require_image, Container, Network};
use e2e::{http, item_names, mcpctl_get, netns, wait_for};

const ADAPTERS: [&str; 6] = ["file", "consul", "zookeeper", "eureka", "kube", "nacos"];
const EUREKA_IMAGE: &str = "ghcr.io/example/mcp-demo-eureka-server:0.1.0";
/// The Nacos server of the compose file (the official image; its stand-in, with the tests' real
/// Nacos 2.4.3, is tests/containers/nacos-server).
const NACOS_IMAGE: &str = "docker.io/nacos/nacos-server:v2.4.3";

fn image(adapter: &str) -> String {
    format!("ghcr.io/example/mcp-adapter-{adapter}:0.1.0")
}

/// One container test at a time (held across its run in its namespace).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `docker.io/library/` for a name without a registry, as Docker and podman resolve it.
fn qualified(image: &str) -> String {
    let first = image.split('/').next().unwrap_or("");
    if !image.contains('/') {
        format!("docker.io/library/{image}")
    } else if first.contains('.') || first.contains(':') || first == "localhost" {
        image.to_string()
    } else {
        format!("docker.io/{image}")
    }
}

/// Service `name` of docker/compose.yaml: its environment as `KEY=value` (a mapping or a list in
/// the file) and its healthcheck's `test`.
fn compose_service(name: &str) -> (Vec<String>, Vec<String>) {
    let compose: Value =
        yaml_serde::from_str(&read(&repo().join("docker/compose.yaml"))).expect("compose YAML");
    let s = &compose["services"][name];
    assert!(s.is_object(), "no service {name} in docker/compose.yaml");
    let env = match &s["environment"] {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    v.as_str().map_or_else(|| v.to_string(), str::to_string)
                )
            })
            .collect(),
        Value::Array(l) => l
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    };
    let test = s["healthcheck"]["test"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    (env, test)
}

/// Every image the compose file and the Dockerfiles start from or run, except the project's own.
fn upstream_images() -> BTreeSet<String> {
    let compose: Value =
        yaml_serde::from_str(&read(&repo().join("docker/compose.yaml"))).expect("compose YAML");
    let mut images = BTreeSet::new();
    for (_, s) in compose["services"].as_object().expect("services") {
        let image = s["image"].as_str().unwrap_or_default();
        if !image.is_empty() && s.get("build").is_none() {
            images.insert(qualified(image));
        }
    }
    for file in ["docker/Dockerfile", "docker/Dockerfile.eureka"] {
        let text = read(&repo().join(file));
        let stages: BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("FROM "))
            .filter_map(|l| l.split_whitespace().nth(2).map(str::to_lowercase))
            .collect();
        for l in text.lines() {
            if let Some(from) = l.trim().strip_prefix("FROM ") {
                let base = from.split_whitespace().next().unwrap_or_default();
                if !stages.contains(&base.to_lowercase()) && base != "scratch" {
                    images.insert(qualified(base));
                }
            }
        }
    }
    images
}

/// The `# image:` names of tests/containers/*/Containerfile.
fn recipe_images() -> BTreeSet<String> {
    let dir = repo().join("tests/containers");
    let mut images = BTreeSet::new();
    for e in std::fs::read_dir(&dir).expect("tests/containers") {
        let file = e.expect("entry").path().join("Containerfile");
        if let Ok(text) = std::fs::read_to_string(&file) {
            let line = text.lines().next().unwrap_or_default();
            let name = line
                .strip_prefix("# image: ")
                .unwrap_or_else(|| panic!("{}: first line is not `# image: NAME`", file.display()));
            images.insert(name.trim().to_string());
        }
    }
    images
}

/// What the compose file and Dockerfiles name, the stand-in recipes provide, tag for tag (and
/// nothing is left over but the stand-ins' own shared bases).
#[test]
fn every_upstream_image_has_a_stand_in_recipe_of_that_exact_name() {
    let wanted = upstream_images();
    let have = recipe_images();
    assert!(wanted.len() >= 13, "the files name {wanted:?}");
    let missing: Vec<_> = wanted.difference(&have).collect();
    assert!(missing.is_empty(), "no stand-in recipe for {missing:?}");
    let extra: Vec<_> = have
        .difference(&wanted)
        .filter(|i| !i.starts_with("localhost/mcp-standin/"))
        .collect();
    assert!(
        extra.is_empty(),
        "recipes for images nothing uses: {extra:?}"
    );
}

/// Short names resolve as Docker and podman resolve them, so the recipes' names are compared
/// with what the files really ask for.
#[test]
fn qualified_names_are_the_ones_podman_and_docker_resolve() {
    assert_eq!(
        qualified("alpine:3.21.3"),
        "docker.io/library/alpine:3.21.3"
    );
    assert_eq!(
        qualified("hashicorp/consul:1.21.4"),
        "docker.io/hashicorp/consul:1.21.4"
    );
    assert_eq!(
        qualified("registry.k8s.io/etcd:3.5.21-0"),
        "registry.k8s.io/etcd:3.5.21-0"
    );
    assert_eq!(
        qualified("docker.io/istio/pilot:1.28.0"),
        "docker.io/istio/pilot:1.28.0"
    );
}

/// The IP of `c` on `net`.
fn ip_on(c: &Container, net: &Network) -> String {
    let out = podman_ok(&[
        "inspect",
        "--format",
        &format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            net.name
        ),
        &c.name,
    ]);
    let ip = out.trim().to_string();
    assert!(!ip.is_empty(), "{} has no address on {}", c.name, net.name);
    ip
}

/// Starts the adapter image with `args` (podman options before the image, adapter flags after
/// `--`), its MCP port published on 127.0.0.1; waits until its HEALTHCHECK passes (it must not
/// before the adapter is ready). The container and `xds://127.0.0.1:PORT`.
fn start_adapter(
    adapter: &str,
    net: Option<&Network>,
    opts: &[&str],
    flags: &[&str],
) -> (Container, String) {
    let name = image(adapter);
    require_image(&name);
    let port = e2e::free_addr().port();
    let publish = format!("127.0.0.1:{port}:15051");
    let mut args: Vec<&str> = Vec::new();
    let net_arg;
    if let Some(n) = net {
        net_arg = format!("--network={}", n.name);
        args.extend([net_arg.as_str(), "-p", publish.as_str()]);
    }
    args.extend_from_slice(opts);
    args.push(&name);
    args.extend_from_slice(flags);
    let c = Container::run(&format!("mcp-{adapter}"), &args);
    let runs = c.wait_healthy(Duration::from_secs(90));
    let health = &c.state()["Health"];
    assert_eq!(health["Status"], "healthy", "{name}: {health}");
    eprintln!("{name}: healthy after {runs} healthcheck run(s)");
    let port = if net.is_some() { port } else { 15051 };
    (c, format!("xds://127.0.0.1:{port}"))
}

/// Waits until `xds` serves exactly `ns_name`, with the one endpoint `address`.
fn wait_served_alone(xds: &str, ns_name: &str, address: &str) {
    let items = wait_for(
        Duration::from_secs(30),
        &format!("{ns_name} served"),
        || {
            let items = mcpctl_get(xds);
            (item_names(&items) == [ns_name]).then_some(items)
        },
    );
    assert_eq!(e2e::endpoint_addresses(&items[0]), [address], "{ns_name}");
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn base64_matches_the_rfc_examples() {
    assert_eq!(e2e::base64(b"foobar"), "Zm9vYmFy");
    assert_eq!(e2e::base64(b"fooba"), "Zm9vYmE=");
    assert_eq!(e2e::base64(b"foob"), "Zm9vYg==");
}

/// Serves `file` to any GET on 0.0.0.0:PORT (the compose network reaches it at its gateway), for
/// the life of the test; the port.
fn serve_file(file: PathBuf) -> u16 {
    let listener = TcpListener::bind("0.0.0.0:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let body = std::fs::read(&file).unwrap_or_default();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/yaml\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
    });
    port
}

/// A command of docker/README.md's walkthrough and the output it shows.
#[derive(Debug)]
struct Step {
    command: String,
    output: Vec<String>,
}

/// The ```console blocks of docker/README.md, in order: `$ ` lines are commands (a trailing
/// `\` continues one), the lines up to the next command what it prints.
fn walkthrough() -> Vec<Step> {
    let text = read(&repo().join("docker/README.md"));
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut continued = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = line.trim() == "```console";
            continue;
        }
        if !in_block {
            continue;
        }
        if continued {
            let last = steps.last_mut().expect("step");
            last.command.push('\n');
            last.command.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(cmd) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: cmd.to_string(),
                output: Vec::new(),
            });
            continued = cmd.ends_with('\\');
        } else if let Some(last) = steps.last_mut() {
            last.output.push(line.to_string());
        }
    }
    steps
}

/// The lines, each with its runs of blanks made one space (tables, `@tsv`), sorted (the README
/// says where order may differ; nowhere does it matter).
fn sorted_lines<S: AsRef<str>>(lines: &[S]) -> Vec<String> {
    let mut v: Vec<String> = lines
        .iter()
        .map(|l| l.as_ref().split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect();
    v.sort();
    v
}

/// What the README shows a value as when it differs from run to run (the VERSION of an entry
/// that carries a registration time).
const VARIES: &str = "(varies)";

/// `want` (from the README) and `got` (printed) line by line, word by word, [`VARIES`]
/// matching any word.
fn lines_match(want: &[String], got: &[String]) -> bool {
    want.len() == got.len()
        && want.iter().zip(got).all(|(w, g)| {
            let (w, g): (Vec<&str>, Vec<&str>) = (w.split(' ').collect(), g.split(' ').collect());
            w.len() == g.len() && w.iter().zip(&g).all(|(a, b)| a == b || *a == VARIES)
        })
}

#[test]
fn a_varying_word_matches_any_word_and_nothing_else_does() {
    let want = vec![format!("eureka hello 1 {VARIES}")];
    assert!(lines_match(
        &want,
        &["eureka hello 1 6f97310aa8d64e64".to_string()]
    ));
    assert!(!lines_match(
        &want,
        &["eureka hello 2 6f97310aa8d64e64".to_string()]
    ));
    assert!(!lines_match(&want, &["eureka hello 1".to_string()]));
    assert!(!lines_match(&want, &[]));
}

/// The tests that run the project's images: scripts/test.sh runs them after the images are built
/// (`--skip images::` leaves them out of the run that goes on beside the build).
mod images {
    use super::*;

    /// Each adapter image as built: the adapter as entrypoint, user 65532, the exec-form mcpctl
    /// healthcheck, the listen defaults, no shell anywhere in it, `--help` runs; its size printed
    /// (docker/README.md) and bounded.
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn adapter_images_run_the_adapter_as_65532_without_a_shell() {
        let _serial = serial();
        for adapter in ADAPTERS {
            let name = image(adapter);
            require_image(&name);
            let i = inspect_image(&name);
            let config = &i["Config"];
            let bin = format!("/usr/local/bin/adapter-{adapter}");
            assert_eq!(config["Entrypoint"], json!([bin]), "{name} entrypoint");
            assert_eq!(config["User"], "65532:65532", "{name} user");
            assert_eq!(
                i["Healthcheck"]["Test"],
                json!(["CMD", "/usr/local/bin/mcpctl", "health", "--timeout", "3s"]),
                "{name} healthcheck (built with --format docker?)"
            );
            let env: Vec<&str> = config["Env"]
                .as_array()
                .expect("Env")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            for want in ["MCP_LISTEN=0.0.0.0:15051", "MCP_ADMIN_LISTEN=0.0.0.0:15052"] {
                assert!(env.contains(&want), "{name} env {env:?} lacks {want}");
            }
            let files = image_files(&name);
            for f in [
                &bin[1..],
                "usr/local/bin/mcpctl",
                "etc/ssl/certs/ca-certificates.crt",
            ] {
                assert!(files.contains(f), "{name} has no {f}");
            }
            let shells: Vec<&String> = files
                .iter()
                .filter(|f| {
                    let base = f.rsplit('/').next().unwrap_or_default();
                    ["sh", "bash", "dash", "ash", "busybox"].contains(&base)
                })
                .collect();
            assert!(shells.is_empty(), "{name} has a shell: {shells:?}");
            let size = i["Size"].as_u64().expect("Size");
            eprintln!("{name}: {:.1} MB", size as f64 / 1e6);
            assert!(size < 60_000_000, "{name} is {size} bytes");

            let help = podman_ok(&["run", "--rm", &name, "--help"]);
            assert!(
                help.contains(&format!("adapter-{adapter}")) && help.contains("--listen"),
                "{name} --help:\n{help}"
            );
            let sh = e2e::podman::try_podman(&[
                "run",
                "--rm",
                "--entrypoint",
                "/bin/sh",
                &name,
                "-c",
                "true",
            ]);
            assert!(!sh.status.success(), "{name} ran /bin/sh");
        }
        let eureka = inspect_image(EUREKA_IMAGE);
        assert_eq!(eureka["Config"]["User"], "65532:65532");
        assert_eq!(eureka["Config"]["Entrypoint"][0], "java");
        eprintln!(
            "{EUREKA_IMAGE}: {:.1} MB",
            eureka["Size"].as_u64().unwrap_or(0) as f64 / 1e6
        );
    }

    /// adapter-file's image, started alone with `examples/` mounted: healthy, and it serves every
    /// entry over MCP on its published port.
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn adapter_file_image_serves_the_examples() {
        let _serial = serial();
        if !netns::isolate("images::adapter_file_image_serves_the_examples") {
            return;
        }
        let net = Network::create();
        let examples = format!("{}:/examples:ro", repo().join("examples").display());
        let (_c, xds) = start_adapter(
            "file",
            Some(&net),
            &["-v", &examples],
            &["--path", "/examples"],
        );
        let mut names = item_names(&mcpctl_get(&xds));
        names.sort();
        assert_eq!(
            names,
            [
                "legacy/billing",
                "legacy/ledger-db",
                "shop/catalog",
                "shop/payments",
                "shop/stripe-api"
            ]
        );
    }

    /// adapter-consul's image beside the Consul stand-in: a service registered in Consul is served.
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn adapter_consul_image_serves_a_consul_service() {
        let _serial = serial();
        if !netns::isolate("images::adapter_consul_image_serves_a_consul_service") {
            return;
        }
        let net = Network::create();
        let netarg = format!("--network={}", net.name);
        let consul_port = e2e::free_addr().port();
        let publish = format!("127.0.0.1:{consul_port}:8500");
        let consul = Container::run(
            "mcp-consul",
            &[
                &netarg,
                "-p",
                &publish,
                "docker.io/hashicorp/consul:1.21.4",
                "agent",
                "-dev",
                "-client",
                "0.0.0.0",
            ],
        );
        consul.wait_healthy_with(&["consul", "members"], Duration::from_secs(60));
        let consul_addr = SocketAddr::from(([127, 0, 0, 1], consul_port));
        let body = r#"{"Node":"n1","Address":"10.9.0.1","Service":{"ID":"web-1","Service":"web","Port":8080}}"#;
        let (status, _) =
            http(consul_addr, "PUT", "/v1/catalog/register", &[], body).expect("register");
        assert_eq!(status, 200);
        // The healthcheck can fail: an adapter whose Consul does not answer is not healthy.
        let unreachable = Container::run(
            "mcp-consul-down",
            &[
                "-e",
                "CONSUL_HTTP_ADDR=http://127.0.0.1:9",
                &image("consul"),
            ],
        );
        std::thread::sleep(Duration::from_secs(3));
        // Unhealthy for the right reason: the adapter runs and its admin port answers, not
        // ready (a container that never started, or an adapter that exited, fails the same
        // check and would pass this test otherwise).
        for _ in 0..3 {
            let state = unreachable.state();
            assert_eq!(
                state["Running"],
                true,
                "the adapter exited ({}):\n{}",
                state["ExitCode"],
                unreachable.logs()
            );
            let check = unreachable.exec(&["/usr/local/bin/mcpctl", "health", "--timeout", "3s"]);
            let said = String::from_utf8_lossy(&check.stderr).into_owned();
            assert!(!check.status.success(), "healthy without its Consul");
            assert!(
                said.contains("not ready (HTTP 503)")
                    && said.contains("waiting for the first sync from consul"),
                "the admin port did not answer not-ready naming Consul: {said}"
            );
            assert!(!unreachable.healthcheck(), "healthy without its Consul");
            std::thread::sleep(Duration::from_secs(1));
        }
        assert_ne!(unreachable.state()["Health"]["Status"], "healthy");
        drop(unreachable);

        let env = format!("CONSUL_HTTP_ADDR=http://{}:8500", ip_on(&consul, &net));
        let (_c, xds) = start_adapter(
            "consul",
            Some(&net),
            &["-e", &env, "-e", "MCP_CONSUL_EXCLUDE_SERVICES=consul"],
            &[],
        );
        wait_served_alone(&xds, "consul/web", "10.9.0.1");
    }

    /// adapter-zookeeper's image beside the ZooKeeper stand-in: a Curator registration (made with
    /// the stand-in's own zkCli.sh) is served.
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn adapter_zookeeper_image_serves_a_curator_service() {
        let _serial = serial();
        if !netns::isolate("images::adapter_zookeeper_image_serves_a_curator_service") {
            return;
        }
        let net = Network::create();
        let netarg = format!("--network={}", net.name);
        let zk = Container::run(
            "mcp-zookeeper",
            &[&netarg, "docker.io/library/zookeeper:3.9.3"],
        );
        zk.wait_healthy_with(&["zkServer.sh", "status"], Duration::from_secs(90));
        let instance = r#"{"name":"web","id":"w1","address":"10.9.0.2","port":8080,"sslPort":null,"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"web","name":"web","metadata":{}},"registrationTimeUTC":1700000000000,"serviceType":"DYNAMIC","uriSpec":null}"#;
        for (path, data) in [
            ("/services", ""),
            ("/services/web", ""),
            ("/services/web/w1", instance),
        ] {
            let out = zk.exec(&[
                "zkCli.sh",
                "-server",
                "127.0.0.1:2181",
                "create",
                path,
                data,
            ]);
            assert!(
                out.status.success(),
                "zkCli.sh create {path}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let env = format!("ZK_SERVERS={}:2181", ip_on(&zk, &net));
        let (_c, xds) = start_adapter("zookeeper", Some(&net), &["-e", &env], &[]);
        wait_served_alone(&xds, "zookeeper/web", "10.9.0.2");
    }

    /// adapter-eureka's image beside the demo's Eureka server image (docker/Dockerfile.eureka): an
    /// instance registered over Eureka's REST API is served.
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn adapter_eureka_image_serves_a_eureka_instance() {
        let _serial = serial();
        if !netns::isolate("images::adapter_eureka_image_serves_a_eureka_instance") {
            return;
        }
        require_image(EUREKA_IMAGE);
        let net = Network::create();
        let netarg = format!("--network={}", net.name);
        let port = e2e::free_addr().port();
        let publish = format!("127.0.0.1:{port}:8761");
        let eureka = Container::run("mcp-eureka", &[&netarg, "-p", &publish, EUREKA_IMAGE]);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_for(Duration::from_secs(180), "Eureka's /eureka/apps", || {
            matches!(http(addr, "GET", "/eureka/apps", &[], ""), Ok((200, _))).then_some(())
        });
        let body = r#"{"instance":{"instanceId":"web-1","hostName":"10.9.0.3","app":"WEB","ipAddr":"10.9.0.3","status":"UP","port":{"$":8080,"@enabled":"true"},"securePort":{"$":443,"@enabled":"false"},"dataCenterInfo":{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"},"leaseInfo":{"renewalIntervalInSecs":30,"durationInSecs":604800}}}"#;
        let (status, resp) = http(
            addr,
            "POST",
            "/eureka/apps/WEB",
            &[("Content-Type", "application/json")],
            body,
        )
        .expect("register");
        assert_eq!(status, 204, "{resp}");
        let env = format!("EUREKA_URL=http://{}:8761/eureka", ip_on(&eureka, &net));
        let (_c, xds) = start_adapter("eureka", Some(&net), &["-e", &env], &[]);
        wait_served_alone(&xds, "eureka/web", "10.9.0.3");
    }

    /// adapter-nacos' image beside the Nacos image (the stand-in holds the tests' real Nacos
    /// 2.4.3), started with docker/compose.yaml's environment for it and found healthy by the
    /// compose file's healthcheck, run in it as the engine runs it; the image's entrypoint refuses
    /// the image's default (cluster) mode. A persistent instance registered over Nacos' Open API
    /// at the Nacos container's own address and HTTP port (where Nacos' own TCP health check of
    /// persistent instances finds a listener) is served under its
    /// `<service>.<group>.<namespace>` name, the adapter watching over gRPC at the HTTP port +
    /// 1000.
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn adapter_nacos_image_serves_a_nacos_instance() {
        let _serial = serial();
        if !netns::isolate("images::adapter_nacos_image_serves_a_nacos_instance") {
            return;
        }
        require_image(NACOS_IMAGE);
        // The official image's layout and entrypoint (what a compose file relies on).
        let i = inspect_image(NACOS_IMAGE);
        assert_eq!(
            i["Config"]["Entrypoint"],
            json!(["sh", "bin/docker-startup.sh"]),
            "{NACOS_IMAGE} entrypoint"
        );
        assert_eq!(i["Config"]["WorkingDir"], "/home/nacos");
        eprintln!(
            "{NACOS_IMAGE}: {:.1} MB",
            i["Size"].as_u64().unwrap_or(0) as f64 / 1e6
        );
        let default_mode = e2e::podman::try_podman(&["run", "--rm", NACOS_IMAGE]);
        assert!(
            !default_mode.status.success()
                && String::from_utf8_lossy(&default_mode.stderr).contains("MODE=standalone"),
            "the image's default MODE (cluster) started: {default_mode:?}"
        );

        let (env, test) = compose_service("nacos");
        assert!(
            env.iter().any(|e| e == "MODE=standalone"),
            "compose.yaml's nacos environment: {env:?}"
        );
        assert_eq!(
            test.first().map(String::as_str),
            Some("CMD-SHELL"),
            "nacos healthcheck: {test:?}"
        );
        let net = Network::create();
        let netarg = format!("--network={}", net.name);
        let port = e2e::free_addr().port();
        let publish = format!("127.0.0.1:{port}:8848");
        let mut args: Vec<&str> = vec![&netarg, "-p", &publish];
        for e in &env {
            args.extend(["-e", e.as_str()]);
        }
        args.push(NACOS_IMAGE);
        let nacos = Container::run("mcp-nacos", &args);
        let started = Instant::now();
        nacos.wait_healthy_with(&["sh", "-c", &test[1]], Duration::from_secs(240));
        eprintln!("{NACOS_IMAGE}: healthy after {:?}", started.elapsed());
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let ip = ip_on(&nacos, &net);
        let register = format!(
            "/nacos/v1/ns/instance?serviceName=web&groupName=DEFAULT_GROUP&ip={ip}&port=8848\
             &weight=1&ephemeral=false"
        );
        // A server that has just started may answer 500 to writes for a few seconds.
        let registered = Instant::now();
        wait_for(
            Duration::from_secs(60),
            "a persistent instance registered",
            || {
                matches!(http(addr, "POST", &register, &[], ""), Ok((200, ref b)) if b == "ok")
                    .then_some(())
            },
        );
        let env = format!("NACOS_ADDR={ip}:8848");
        let (_c, xds) = start_adapter("nacos", Some(&net), &["-e", &env], &[]);
        wait_served_alone(&xds, "nacos/web.default-group.public", &ip);
        // Nacos' health check (every few seconds) has run by now and found the port open.
        if let Some(rest) = Duration::from_secs(15).checked_sub(registered.elapsed()) {
            std::thread::sleep(rest);
        }
        let list =
            "/nacos/v1/ns/instance/list?serviceName=web&groupName=DEFAULT_GROUP&healthyOnly=false";
        let (status, body) = http(addr, "GET", list, &[], "").expect("instance list");
        assert_eq!(status, 200, "{body}");
        let hosts: Value = serde_json::from_str(&body).expect("instance list JSON");
        assert_eq!(hosts["hosts"][0]["healthy"], true, "{body}");
    }

    /// adapter-kube's image against the tests' kube-apiserver, with a kubeconfig mounted read-only
    /// (host network: the test API server listens on loopback only).
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn adapter_kube_image_serves_a_kubernetes_service() {
        let _serial = serial();
        if !netns::isolate("images::adapter_kube_image_serves_a_kubernetes_service") {
            return;
        }
        let kube = KubeApiServer::start();
        kube.namespace("shop");
        kube.apply_service(&e2e::kube::service("shop", "web", &[("http", 80, 8080)]));
        kube.apply_slice(&e2e::kube::slice(
            "shop",
            "web-1",
            "web",
            "IPv4",
            &[("http", 8080)],
            vec![e2e::kube::ready("10.9.0.4")],
        ));
        // The kubeconfig with the CA inline, readable by the image's user 65532.
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = std::fs::read(kube.ca()).expect("read CA");
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "t", "cluster": {"server": kube.url(), "certificate-authority-data": e2e::base64(&ca)}}],
            "users": [{"name": "t", "user": {"token": e2e::kube::ADMIN_TOKEN}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            "current-context": "t",
        });
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, config.to_string()).expect("write kubeconfig");
        chmod(dir.path(), 0o755);
        chmod(&kubeconfig, 0o644);
        let mount = format!("{}:/kubeconfig:ro", kubeconfig.display());
        let (_c, xds) = start_adapter(
            "kube",
            None,
            &[
                "--network=host",
                "-v",
                &mount,
                "-e",
                "KUBECONFIG=/kubeconfig",
            ],
            &["--listen=127.0.0.1:15051", "--admin-listen=127.0.0.1:15052"],
        );
        let items = wait_for(Duration::from_secs(30), "shop/web served", || {
            let items = mcpctl_get(&xds);
            item_names(&items)
                .contains(&"shop/web".to_string())
                .then_some(items)
        });
        let web = e2e::find(&items, "web").expect("web");
        assert_eq!(e2e::endpoint_addresses(web), ["10.9.0.4"]);
    }

    /// docker/compose.yaml for real: every image built as above, `docker compose up -d` (Compose v2
    /// against podman's Docker API), every healthcheck healthy and every seed exited 0; then each
    /// command of docker/README.md's walkthrough prints what the README shows (requests through the
    /// compose's Envoy answered by the backend registered in Consul, in ZooKeeper, in Eureka and in
    /// Nacos;
    /// each adapter's table; istiod's registryz; an instance taken out and traffic moving), and
    /// `docker compose down -v` leaves nothing behind.
    #[test]
    #[ignore = "needs podman and the images: tests/containers/build.sh target && tests/containers/build-images.sh (scripts/test.sh runs both)"]
    fn compose_demo_comes_up_and_its_walkthrough_prints_what_the_readme_shows() {
        let _serial = serial();
        if !netns::isolate(
            "images::compose_demo_comes_up_and_its_walkthrough_prints_what_the_readme_shows",
        ) {
            return;
        }
        for adapter in ["consul", "zookeeper", "file", "eureka", "nacos"] {
            require_image(&image(adapter));
        }
        require_image(EUREKA_IMAGE);
        require_image(NACOS_IMAGE);
        let steps = walkthrough();
        assert!(
            steps.len() >= 10,
            "the walkthrough has {} commands",
            steps.len()
        );

        // seed-istio takes the CRDs of the pinned Istio module (the compose network's gateway is this
        // namespace) instead of GitHub's copy of Istio 1.28.0's.
        let crds_port = serve_file(e2e::istiod::istio_crds());
        let crds_url = format!("http://10.203.0.1:{crds_port}/crd-all.gen.yaml");
        let mut compose = Compose::new(
            &repo().join("docker/compose.yaml"),
            &[("ISTIO_CRDS_URL", &crds_url)],
        );
        let started = Instant::now();
        compose.up(Duration::from_secs(900));
        eprintln!("docker compose up -d: {:?}", started.elapsed());

        // Every service up: the ones with a healthcheck healthy, the one-shot ones exited 0.
        let ps = compose.ps();
        let mut states = Vec::new();
        for c in &ps {
            let service = c["Service"].as_str().unwrap_or_default().to_string();
            let state = c["State"].as_str().unwrap_or_default().to_string();
            let health = c["Health"].as_str().unwrap_or_default().to_string();
            let exit = c["ExitCode"].as_i64().unwrap_or(-1);
            states.push((service, state, health, exit));
        }
        let expect_healthy = [
            "consul",
            "zookeeper",
            "eureka",
            "nacos",
            "etcd",
            "adapter-consul",
            "adapter-zookeeper",
            "adapter-file",
            "adapter-eureka",
            "adapter-nacos",
        ];
        for s in expect_healthy {
            assert!(
                states
                    .iter()
                    .any(|(n, st, h, _)| n == s && st == "running" && h == "healthy"),
                "{s} not running and healthy: {states:?}"
            );
        }
        for s in [
            "seed",
            "seed-zookeeper",
            "seed-eureka",
            "seed-nacos",
            "seed-istio",
            "kube-certs",
        ] {
            assert!(
                states
                    .iter()
                    .any(|(n, st, _, code)| n == s && st == "exited" && *code == 0),
                "{s} did not exit 0: {states:?}"
            );
        }
        for s in [
            "istiod",
            "envoy",
            "kube-apiserver",
            "backend-consul",
            "backend-zookeeper",
            "backend-eureka",
            "backend-nacos",
        ] {
            assert!(
                states.iter().any(|(n, st, _, _)| n == s && st == "running"),
                "{s} not running: {states:?}"
            );
        }
        // Envoy turns healthy once istiod's first configuration is in.
        wait_for(Duration::from_secs(180), "envoy healthy", || {
            compose
                .ps()
                .iter()
                .any(|c| c["Service"] == "envoy" && c["Health"] == "healthy")
                .then_some(())
        });

        // Each command until it prints what the README shows (a change takes a moment to reach
        // Envoy; Nacos finds a restarted backend healthy again only after its ARP entry for the
        // old container expired, 35-60 s here); every mismatch is reported, not only the first.
        let mut wrong = Vec::new();
        for step in &steps {
            let want = sorted_lines(&step.output);
            let end = Instant::now() + Duration::from_secs(120);
            let started = Instant::now();
            loop {
                let out = compose.sh(&step.command);
                let got_text = String::from_utf8_lossy(&out.stdout).into_owned();
                let got = sorted_lines(&got_text.lines().collect::<Vec<_>>());
                if out.status.success() && lines_match(&want, &got) {
                    eprintln!("ok ({:?}): $ {}", started.elapsed(), step.command);
                    break;
                }
                if Instant::now() > end {
                    wrong.push(format!(
                        "`$ {}` printed (exit {}):\n{got_text}{}\nbut the README shows:\n{}\n",
                        step.command,
                        out.status,
                        String::from_utf8_lossy(&out.stderr),
                        step.output.join("\n")
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        }
        assert!(
            wrong.is_empty(),
            "docker/README.md's walkthrough:\n{}",
            wrong.join("\n")
        );

        // The access log has the requests (one line per request, in Istio's format). Envoy
        // writes it to its file (here stdout) every 10 s (`--file-flush-interval-msec`), not per
        // request: a read right after the walkthrough missed its last lines on a fresh machine.
        // So it is read until every host's 200 is in it, for up to three flushes.
        let hosts = [
            "hello.service.consul",
            "hello.zookeeper",
            "hello.eureka",
            "hello.default-group.public.nacos",
        ];
        let end = Instant::now() + Duration::from_secs(35);
        loop {
            let logs = compose.ok(&["logs", "envoy"]);
            let missing: Vec<&str> = hosts
                .iter()
                .copied()
                .filter(|host| {
                    !logs
                        .lines()
                        .any(|l| l.contains(&format!("\"{host}\"")) && l.contains(" 200 "))
                })
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < end,
                "no 200 for {missing:?} in Envoy's access log after 35 s:\n{}",
                e2e::tail(&logs, 40)
            );
            std::thread::sleep(Duration::from_secs(1));
        }

        // Nothing crashed and came back on the way (the adapters restart `unless-stopped`), and
        // every container with a healthcheck is healthy still.
        for c in compose.ps() {
            let name = c["Name"].as_str().unwrap_or_default().to_string();
            let restarts = podman_ok(&["inspect", "--format", "{{.RestartCount}}", &name]);
            assert_eq!(restarts.trim(), "0", "{name} restarted");
            let health = c["Health"].as_str().unwrap_or_default();
            assert!(health.is_empty() || health == "healthy", "{name}: {health}");
        }

        // The listing sees the project before `down` (its filter matches: every container,
        // its network and its volume), so an empty one after it means something.
        let before = compose.leftovers();
        for c in compose.ps() {
            let name = c["Name"].as_str().unwrap_or_default();
            assert!(
                before.contains(&format!("container {name}")),
                "{name} not in the listing of the project: {before:?}"
            );
        }
        for what in ["network ", "volume "] {
            assert!(
                before.iter().any(|l| l.starts_with(what)),
                "no {what}in the listing of the project: {before:?}"
            );
        }
        compose.down();
        let left = compose.leftovers();
        assert!(left.is_empty(), "docker compose down -v left {left:?}");
    }
}
