//! TLS on the gRPC port: server TLS for sinks that verify it, and client certificates demanded
//! when `--tls-client-ca` is set. Certificates come from the openssl CLI.

use std::path::Path;
use std::process::Command;

use e2e::{workspace_bin, Adapter};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is needed for the TLS tests");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
fn make_pki(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
    ]);
    openssl(dir, &ca);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("ext");
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    for (who, ext) in [("server", "server.ext"), ("client", "client.ext")] {
        let key = format!("{who}.key");
        let csr = format!("{who}.csr");
        let crt = format!("{who}.crt");
        let subj = format!("/CN={who}");
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                ext,
            ],
        );
    }
}

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

#[test]
fn server_tls_and_required_client_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    make_pki(dir.path());
    let f = |n: &str| dir.path().join(n).to_string_lossy().to_string();
    let input = example_dir(dir.path());

    let adapter = Adapter::start(
        "adapter-file",
        &[
            "--path",
            &input,
            "--tls-cert",
            &f("server.crt"),
            "--tls-key",
            &f("server.key"),
        ],
    );
    adapter.wait_ready();
    let server = format!("xds://127.0.0.1:{}", adapter.grpc.port());
    let ok = mcpctl(&server, &["--tls-ca", &f("ca.crt")]);
    assert!(
        ok.status.success(),
        "TLS sink failed: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&ok.stdout).expect("mcpctl JSON");
    assert_eq!(list["items"][0]["metadata"]["name"], "a");
    assert_eq!(list["items"][0]["metadata"]["namespace"], "ns");
    let plain = mcpctl(&server, &[]);
    assert!(
        !plain.status.success(),
        "a plaintext sink must not get through a TLS port"
    );
    drop(adapter);

    let adapter = Adapter::start(
        "adapter-file",
        &[
            "--path",
            &input,
            "--tls-cert",
            &f("server.crt"),
            "--tls-key",
            &f("server.key"),
            "--tls-client-ca",
            &f("ca.crt"),
        ],
    );
    adapter.wait_ready();
    let server = format!("xds://127.0.0.1:{}", adapter.grpc.port());
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
