//! TLS on the gRPC port: server TLS for sinks that verify it, and client certificates demanded
//! when `--tls-client-ca` is set. Certificates come from the openssl CLI.

use std::path::Path;
use std::process::Command;

use e2e::pki::make_pki;
use e2e::{workspace_bin, Adapter};

fn mcpctl(server: &str, extra: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("mcpctl"))
        .args([
            "get",
            "se",
            "--server",
            server,
            "-o",
            "json",
            "--timeout",
            "3s",
        ])
        .args(extra)
        .output()
        .expect("run mcpctl")
}

fn example_dir(dir: &Path) -> String {
    let p = dir.join("se.yaml");
    std::fs::write(
        &p,
        "kind: Inventory\nnamespace: ns\nservices:\n- name: a\n  ports: {http: 80}\n  endpoints: [10.0.0.1]\n",
    )
    .expect("write");
    p.to_string_lossy().to_string()
}

/// `dir`'s file `name` (made by [`make_pki`]), as an argument.
fn pki_file(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().to_string()
}

/// adapter-file on `input` serving TLS with `dir`'s server certificate, `extra` flags added,
/// ready: it and its `xds://` address.
fn tls_adapter(dir: &Path, input: &str, extra: &[&str]) -> (Adapter, String) {
    let (cert, key) = (pki_file(dir, "server.crt"), pki_file(dir, "server.key"));
    let mut args = vec!["--path", input, "--tls-cert", &cert, "--tls-key", &key];
    args.extend_from_slice(extra);
    let adapter = Adapter::start("adapter-file", &args);
    adapter.wait_ready();
    let server = format!("xds://127.0.0.1:{}", adapter.grpc.port());
    (adapter, server)
}

#[test]
fn server_tls_and_required_client_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    make_pki(dir.path());
    let f = |n: &str| pki_file(dir.path(), n);
    let input = example_dir(dir.path());

    let (adapter, server) = tls_adapter(dir.path(), &input, &[]);
    let ok = mcpctl(&server, &["--tls-ca", &f("ca.crt")]);
    assert!(
        ok.status.success(),
        "TLS sink failed: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&ok.stdout).expect("mcpctl JSON");
    assert_eq!(list["items"][0]["metadata"]["name"], "a");
    assert_eq!(list["items"][0]["metadata"]["namespace"], "ns");
    // What a stream knows of its connection (peer, age, whether over --max-connections)
    // survives the TLS layer.
    let log = adapter.log();
    assert!(
        log.lines()
            .any(|l| l.contains("Sink connected") && l.contains("127.0.0.1:")),
        "the sink's peer is known under TLS:\n{}",
        adapter.log_tail()
    );
    let plain = mcpctl(&server, &[]);
    assert!(
        !plain.status.success(),
        "a plaintext sink must not get through a TLS port"
    );
    drop(adapter);

    let (mtls, server) = tls_adapter(dir.path(), &input, &["--tls-client-ca", &f("ca.crt")]);
    let anonymous = mcpctl(&server, &["--tls-ca", &f("ca.crt")]);
    assert!(
        !anonymous.status.success(),
        "a sink without a client certificate must be refused"
    );
    // Counted as a failed handshake (after the alert is sent, so maybe after mcpctl exits).
    e2e::wait_for(
        std::time::Duration::from_secs(30),
        "the refused handshake counted",
        || {
            (mtls.metric_with(
                "mcp_adapter_tls_refused_connections_total",
                "reason=\"handshake\"",
            ) >= 1.0)
                .then_some(())
        },
    );
    let with_cert = mcpctl(
        &server,
        &[
            "--tls-ca",
            &f("ca.crt"),
            "--tls-cert",
            &f("client.crt"),
            "--tls-key",
            &f("client.key"),
        ],
    );
    assert!(
        with_cert.status.success(),
        "mTLS sink failed: {}",
        String::from_utf8_lossy(&with_cert.stderr)
    );
}

/// `mcpctl health [--admin HOST:PORT]` as the images' HEALTHCHECK runs it (exec form, the
/// adapter's environment); its exit status and output.
fn health(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(workspace_bin("mcpctl"))
        .arg("health")
        .args(args)
        .env_remove("MCP_ADMIN_LISTEN")
        .envs(env.iter().copied())
        .output()
        .expect("run mcpctl health");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The health check asks the plain admin port, so it holds on an adapter whose MCP port demands
/// client certificates (where the check before it, `mcpctl get serviceentries`, cannot get in
/// without the CA, a certificate and its key); it tells an adapter not ready yet (503) and one that
/// is gone apart, each with its reason.
#[test]
fn the_health_check_needs_no_certificate_and_tells_not_ready_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    make_pki(dir.path());
    let input = example_dir(dir.path());
    let ca = pki_file(dir.path(), "ca.crt");
    let (mut adapter, server) = tls_adapter(dir.path(), &input, &["--tls-client-ca", &ca]);
    let admin = adapter.admin.to_string();

    let old_check = mcpctl(&server, &[]);
    assert!(!old_check.status.success(), "plaintext into a TLS port");
    let (ok, out, err) = health(&["--admin", &admin, "--timeout", "3s"], &[]);
    assert!(ok, "mcpctl health on a ready TLS adapter: {err}");
    assert_eq!(out, "ready\n");
    // The image's HEALTHCHECK as written in docker/Dockerfile, with the address from the
    // adapter's own MCP_ADMIN_LISTEN (0.0.0.0:PORT, as the image sets it).
    let argv = dockerfile_healthcheck();
    assert_eq!(argv[0], "/usr/local/bin/mcpctl", "{argv:?}");
    let listen = format!("0.0.0.0:{}", adapter.admin.port());
    let run = Command::new(workspace_bin("mcpctl"))
        .args(&argv[1..])
        .env("MCP_ADMIN_LISTEN", &listen)
        .output()
        .expect("run the HEALTHCHECK");
    assert!(
        run.status.success(),
        "the Dockerfile's HEALTHCHECK {argv:?}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&run.stdout), "ready\n");
    // The check costs the adapter no MCP stream and no push (the one before pulled the whole
    // set each time); and nothing else moves meanwhile.
    let pushes = adapter.metric("mcp_adapter_pushes_total");
    for _ in 0..5 {
        assert!(health(&["--admin", &admin], &[]).0);
    }
    assert_eq!(adapter.metric("mcp_adapter_pushes_total"), pushes);
    assert_eq!(adapter.metric("mcp_adapter_connected_sinks"), 0.0);
    adapter.assert_steady(std::time::Duration::from_secs(1));

    // Not ready yet: a Consul adapter (TLS on too) whose Consul does not answer.
    let (cert, key) = (
        pki_file(dir.path(), "server.crt"),
        pki_file(dir.path(), "server.key"),
    );
    let nowhere = format!("http://{}", e2e::free_addr());
    let waiting = Adapter::start(
        "adapter-consul",
        &[
            "--consul-addr",
            &nowhere,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    let (ok, out, err) = health(&["--admin", &waiting.admin.to_string()], &[]);
    assert!(!ok, "not ready yet, but healthy: {out}");
    assert!(
        err.contains("not ready (HTTP 503): not ready: waiting for the first sync from consul"),
        "{err}"
    );
    assert_eq!(waiting.get("/readyz").0, 503, "stays not ready");

    // Gone: the error names the port.
    adapter.kill();
    let (ok, _, err) = health(&["--admin", &admin, "--timeout", "2s"], &[]);
    assert!(!ok);
    assert!(err.contains(&format!("admin port {admin}")), "{err}");
}

/// The argv of docker/Dockerfile's HEALTHCHECK (`CMD [...]`, exec form).
fn dockerfile_healthcheck() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker/Dockerfile");
    let text = std::fs::read_to_string(&path).expect("docker/Dockerfile");
    let cmd = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("CMD ["))
        .expect("a HEALTHCHECK CMD line");
    serde_json::from_str(&format!("[{cmd}")).expect("exec-form CMD is a JSON array")
}
