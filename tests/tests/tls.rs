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

    let (_adapter, server) = tls_adapter(dir.path(), &input, &["--tls-client-ca", &f("ca.crt")]);
    let anonymous = mcpctl(&server, &["--tls-ca", &f("ca.crt")]);
    assert!(
        !anonymous.status.success(),
        "a sink without a client certificate must be refused"
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
