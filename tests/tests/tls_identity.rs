//! mTLS beyond "signed by the CA": `--tls-client-san` admits only the named client identities,
//! and the certificate, key and client CAs are reloaded from disk without ending open streams
//! (issue #22 item 3). The adapter-file binary, mcpctl and the openssl CLI, which makes every
//! certificate and reads the one a new connection is served.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use e2e::pki::{issue, make_pki};
use e2e::{wait_for, workspace_bin, Adapter};

const ISTIOD: &str = "spiffe://cluster.local/ns/istio-system/sa/istiod";
const SLEEP: &str = "spiffe://cluster.local/ns/default/sa/sleep";
const WAIT: Duration = Duration::from_secs(60);

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

fn services_yaml(names: &[&str]) -> String {
    let mut s = String::from("kind: Inventory\nnamespace: ns\nservices:\n");
    for (i, n) in names.iter().enumerate() {
        s.push_str(&format!(
            "- name: {n}\n  ports: {{http: 80}}\n  endpoints: [10.0.0.{}]\n",
            i + 1
        ));
    }
    s
}

/// mcpctl's TLS flags for the client certificate `who` (`who.crt`, `who.key` in `dir`).
fn client_flags(dir: &Path, who: &str) -> Vec<String> {
    vec![
        "--tls-ca".into(),
        path(dir, "ca.crt"),
        "--tls-cert".into(),
        path(dir, &format!("{who}.crt")),
        "--tls-key".into(),
        path(dir, &format!("{who}.key")),
    ]
}

/// `mcpctl get se` once against `server` as `who`: success and stderr.
fn get_as(server: &str, dir: &Path, who: &str) -> (bool, String) {
    let out = mcpctl_as(server, dir, who);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The names `mcpctl get se` lists against `server` as `who`, who must be served.
fn names_as(server: &str, dir: &Path, who: &str) -> Vec<String> {
    let out = mcpctl_as(server, dir, who);
    assert!(
        out.status.success(),
        "{who} on {server}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("mcpctl JSON");
    e2e::item_names(
        list["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default(),
    )
}

fn mcpctl_as(server: &str, dir: &Path, who: &str) -> std::process::Output {
    Command::new(workspace_bin("mcpctl"))
        .args([
            "get",
            "se",
            "--server",
            server,
            "-o",
            "json",
            "--timeout",
            "10s",
        ])
        .args(client_flags(dir, who))
        .output()
        .expect("run mcpctl")
}

/// Serial number (as `openssl x509 -serial` prints it) of the certificate a new TLS connection
/// to `addr` is served; the client presents `dir`'s `client` certificate.
fn served_serial(addr: std::net::SocketAddr, dir: &Path) -> String {
    let hello = Command::new("openssl")
        .current_dir(dir)
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            "localhost",
        ])
        .args([
            "-CAfile",
            "ca.crt",
            "-cert",
            "client.crt",
            "-key",
            "client.key",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    let mut x509 = Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl x509");
    x509.stdin
        .take()
        .expect("stdin")
        .write_all(&hello.stdout)
        .expect("feed openssl x509");
    let out = x509.wait_with_output().expect("openssl x509");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Serial of the certificate file `dir/name`.
fn file_serial(dir: &Path, name: &str) -> String {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(["x509", "-noout", "-serial", "-in", name])
        .output()
        .expect("openssl x509");
    assert!(out.status.success(), "openssl x509 -in {name}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Unix seconds of `dir/name`'s notAfter (`openssl x509 -enddate`, read by `date`).
fn file_not_after(dir: &Path, name: &str) -> f64 {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(["x509", "-noout", "-enddate", "-in", name])
        .output()
        .expect("openssl x509");
    let text = String::from_utf8_lossy(&out.stdout);
    let date = text.trim().strip_prefix("notAfter=").expect("notAfter=");
    let secs = Command::new("date")
        .args(["-u", "-d", date, "+%s"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&secs.stdout)
        .trim()
        .parse()
        .expect("seconds")
}

#[test]
fn only_clients_with_an_allowed_san_are_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    make_pki(d);
    let client = "extendedKeyUsage=clientAuth\n";
    issue(
        d,
        "istiod",
        &format!("subjectAltName=URI:{ISTIOD}\n{client}"),
        2,
    );
    issue(
        d,
        "sink-dns",
        &format!("subjectAltName=DNS:MCP-Sink.istio-system.svc\n{client}"),
        2,
    );
    issue(
        d,
        "sleep",
        &format!("subjectAltName=URI:{SLEEP},DNS:sleep.default.svc\n{client}"),
        2,
    );
    std::fs::write(d.join("se.yaml"), services_yaml(&["a"])).expect("write");

    // The flag needs --tls-client-ca, and a bad entry is refused naming it.
    let run = |extra: &[&str]| {
        let out = Command::new(workspace_bin("adapter-file"))
            .args(["--path", &path(d, "se.yaml")])
            .args([
                "--tls-cert",
                &path(d, "server.crt"),
                "--tls-key",
                &path(d, "server.key"),
            ])
            .args(extra)
            .output()
            .expect("run adapter-file");
        assert!(!out.status.success(), "{extra:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--tls-client-san", ISTIOD]);
    assert!(err.contains("--tls-client-ca"), "{err}");
    let ca = path(d, "ca.crt");
    let err = run(&[
        "--tls-client-ca",
        &ca,
        "--tls-client-san",
        "*.istio-system.svc",
    ]);
    assert!(
        err.contains("*.istio-system.svc") && err.contains("matched exactly"),
        "{err}"
    );

    let allow = format!("{ISTIOD},mcp-sink.istio-system.svc");
    let adapter = Adapter::start(
        "adapter-file",
        &[
            "--path",
            &path(d, "se.yaml"),
            "--tls-cert",
            &path(d, "server.crt"),
            "--tls-key",
            &path(d, "server.key"),
            "--tls-client-ca",
            &ca,
            "--tls-client-san",
            &allow,
        ],
    );
    adapter.wait_ready();
    let xds = adapter.xds_url();
    let mcp = format!("mcp://{}", adapter.grpc);
    for who in ["istiod", "sink-dns"] {
        for server in [&xds, &mcp] {
            let (ok, err) = get_as(server, d, who);
            assert!(ok, "{who} on {server} refused: {err}");
        }
    }
    for server in [&xds, &mcp] {
        let (ok, err) = get_as(server, d, "sleep");
        assert!(
            !ok,
            "a certificate without an allowed SAN was served on {server}"
        );
        assert!(
            err.contains("not allowed by this adapter's --tls-client-san")
                && err.contains(&format!("URI:{SLEEP}"))
                && err.contains("DNS:sleep.default.svc"),
            "{err}"
        );
        assert!(err.to_lowercase().contains("permission"), "{err}");
    }
    // A certificate with no SAN at all (CN=client) is refused too.
    let (ok, err) = get_as(&xds, d, "client");
    assert!(!ok && err.contains("names [] are not allowed"), "{err}");
    let refused = |reason: &str| {
        adapter.metric_with(
            "mcp_adapter_tls_refused_connections_total",
            &format!("reason=\"{reason}\""),
        )
    };
    assert!(
        refused("san_not_allowed") >= 3.0,
        "{}",
        adapter.get("/metrics").1
    );
    assert!(
        adapter.log().contains(SLEEP) && adapter.log().contains("--tls-client-san"),
        "the refusal is logged with the presented names: {}",
        adapter.log_tail()
    );
    // Steady: the allowed clients' handshakes all succeeded, nothing else moved.
    assert_eq!(refused("handshake"), 0.0, "{}", adapter.log_tail());
    assert_eq!(adapter.metric("mcp_adapter_tls_reloads_total"), 0.0);
    assert_eq!(adapter.metric("mcp_adapter_tls_reload_failing"), 0.0);
    assert_eq!(adapter.metric("mcp_adapter_connected_sinks"), 0.0);
    let (snapshots, san_refused) = (
        adapter.metric("mcp_adapter_snapshots_total"),
        refused("san_not_allowed"),
    );
    adapter.assert_steady(Duration::from_secs(1));

    // A service added after the window is the one new snapshot since before it, served to an
    // allowed client, and nothing else moved: a snapshot, reload or refusal that came late,
    // after the window, would be counted here.
    // Replaced in one rename: a half-written file read would be a snapshot of its own.
    std::fs::write(d.join("se.yaml.tmp"), services_yaml(&["a", "b"])).expect("write");
    std::fs::rename(d.join("se.yaml.tmp"), d.join("se.yaml")).expect("rename");
    wait_for(WAIT, "b served to istiod", || {
        (names_as(&xds, d, "istiod") == ["ns/a", "ns/b"]).then_some(())
    });
    assert_eq!(
        adapter.metric("mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "the edit is the one snapshot since before the window; log:\n{}",
        adapter.log_tail()
    );
    assert_eq!(
        (refused("handshake"), refused("san_not_allowed")),
        (0.0, san_refused),
        "{}",
        adapter.log_tail()
    );
    assert_eq!(adapter.metric("mcp_adapter_tls_reloads_total"), 0.0);
}

/// A Kubernetes secret volume: `tls.crt`, `tls.key` and `ca.crt` are links through `..data` to a
/// timestamped directory, and an update re-points `..data` at a new one in one rename.
struct SecretMount {
    root: std::path::PathBuf,
    generation: u32,
}

impl SecretMount {
    /// The mount in `dir/mount`, first holding `dir`'s `cert`, `key` and `ca.crt`.
    fn new(dir: &Path, cert: &str, key: &str) -> Self {
        let root = dir.join("mount");
        std::fs::create_dir(&root).expect("mkdir mount");
        let mut m = Self {
            root,
            generation: 0,
        };
        m.update(dir, cert, key, "ca.crt");
        for f in ["tls.crt", "tls.key", "ca.crt"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), m.root.join(f)).expect("link");
        }
        m
    }

    /// Swaps in `dir`'s `cert`, `key` and `ca` as the kubelet does.
    fn update(&mut self, dir: &Path, cert: &str, key: &str, ca: &str) {
        self.generation += 1;
        let data = format!("..2026_11_24_{}", self.generation);
        let target = self.root.join(&data);
        std::fs::create_dir(&target).expect("mkdir data");
        for (from, to) in [(cert, "tls.crt"), (key, "tls.key"), (ca, "ca.crt")] {
            std::fs::copy(dir.join(from), target.join(to)).expect("copy into the mount");
        }
        let tmp = self.root.join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).expect("link ..data_tmp");
        std::fs::rename(&tmp, self.root.join("..data")).expect("swap ..data");
    }

    fn file(&self, name: &str) -> String {
        path(&self.root, name)
    }
}

/// mcpctl --watch as `client`: its stdout lines arrive on the receiver.
struct Watch {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    fn start(server: &str, dir: &Path) -> Self {
        let mut child = Command::new(workspace_bin("mcpctl"))
            .args(["get", "se", "--server", server, "--watch", "-o", "json"])
            .args(client_flags(dir, "client"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mcpctl --watch");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits until a line containing `needle` arrives.
    fn wait_line(&self, needle: &str) {
        let end = std::time::Instant::now() + WAIT;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return,
                Ok(_) => {}
                Err(e) => panic!("the open stream never showed {needle:?}: {e}"),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_renewed_certificate_is_served_to_new_connections_without_dropping_open_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    make_pki(d);
    let server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    issue(d, "renewed", server_ext, 3);
    // A certificate whose key is another's, and one that is not PEM at all.
    issue(d, "other", server_ext, 3);
    std::fs::write(d.join("garbage.crt"), "not a certificate\n").expect("write");
    issue(d, "fixed", server_ext, 4);
    std::fs::write(d.join("se.yaml"), services_yaml(&["a"])).expect("write");

    let mut mount = SecretMount::new(d, "server.crt", "server.key");
    let adapter = Adapter::start(
        "adapter-file",
        &[
            "--path",
            &path(d, "se.yaml"),
            "--poll-interval",
            "50ms",
            "--tls-cert",
            &mount.file("tls.crt"),
            "--tls-key",
            &mount.file("tls.key"),
            "--tls-client-ca",
            &mount.file("ca.crt"),
            "--tls-reload-interval",
            "200ms",
        ],
    );
    adapter.wait_ready();
    let serial = |name: &str| file_serial(d, name);
    assert_eq!(served_serial(adapter.grpc, d), serial("server.crt"));
    assert_eq!(
        adapter.metric("mcp_adapter_tls_certificate_not_after_seconds"),
        file_not_after(d, "server.crt")
    );
    let watch = Watch::start(&adapter.xds_url(), d);
    watch.wait_line("\"a\"");
    let connected = |a: &Adapter| a.log().matches("Sink connected.").count();
    assert_eq!(connected(&adapter), 1);

    // Renewed: new connections get the new certificate, the open stream goes on.
    mount.update(d, "renewed.crt", "renewed.key", "ca.crt");
    let reloads = |a: &Adapter, result: &str| {
        a.metric_with(
            "mcp_adapter_tls_reloads_total",
            &format!("result=\"{result}\""),
        )
    };
    wait_for(WAIT, "the renewed certificate taken", || {
        (reloads(&adapter, "ok") >= 1.0).then_some(())
    });
    assert_eq!(served_serial(adapter.grpc, d), serial("renewed.crt"));
    assert_eq!(
        adapter.metric("mcp_adapter_tls_certificate_not_after_seconds"),
        file_not_after(d, "renewed.crt")
    );
    std::fs::write(d.join("se.yaml"), services_yaml(&["a", "b"])).expect("write");
    watch.wait_line("\"b\"");
    assert_eq!(
        connected(&adapter),
        1,
        "the stream was reopened: {}",
        adapter.log_tail()
    );
    assert_eq!(adapter.metric("mcp_adapter_connected_sinks"), 1.0);

    // A broken renewal (key not the certificate's; then not PEM): the last good certificate is
    // still served, the error names the file, the gauge says so; readyz holds.
    for (cert, key, file) in [
        ("other.crt", "renewed.key", "tls.key"),
        ("garbage.crt", "renewed.key", "tls.crt"),
    ] {
        let errors = reloads(&adapter, "error");
        mount.update(d, cert, key, "ca.crt");
        wait_for(WAIT, "the broken pair reported", || {
            (reloads(&adapter, "error") > errors).then_some(())
        });
        assert_eq!(adapter.metric("mcp_adapter_tls_reload_failing"), 1.0);
        let log = adapter.log();
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("is not usable; still serving the previous one"))
            .expect("the error is logged");
        assert!(line.contains(&mount.file(file)), "{line}");
        assert_eq!(served_serial(adapter.grpc, d), serial("renewed.crt"));
        assert_eq!(adapter.get("/readyz").0, 200);
        let (ok, err) = get_as(&adapter.xds_url(), d, "client");
        assert!(ok, "a new sink on the last good certificate: {err}");
    }
    // Fixed: taken, the gauge clears.
    mount.update(d, "fixed.crt", "fixed.key", "ca.crt");
    wait_for(WAIT, "the fixed pair taken", || {
        (adapter.metric("mcp_adapter_tls_reload_failing") == 0.0).then_some(())
    });
    assert_eq!(served_serial(adapter.grpc, d), serial("fixed.crt"));
    std::fs::write(d.join("se.yaml"), services_yaml(&["a", "b", "c"])).expect("write");
    watch.wait_line("\"c\"");
    assert_eq!(reloads(&adapter, "error"), 2.0);

    // The client CAs rotate: a bundle of the old CA and a new one. A client of the new CA is
    // refused until the bundle is taken, then served.
    let d2 = d.join("ca2");
    std::fs::create_dir(&d2).expect("mkdir ca2");
    make_pki(&d2);
    for f in ["client.crt", "client.key"] {
        std::fs::copy(d2.join(f), d.join(format!("new-ca-{f}"))).expect("copy");
    }
    let bundle = [d.join("ca.crt"), d2.join("ca.crt")]
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("read CA"))
        .collect::<String>();
    std::fs::write(d.join("bundle.crt"), bundle).expect("write the bundle");
    let (ok, _) = get_as(&adapter.xds_url(), d, "new-ca-client");
    assert!(!ok, "a client of a CA not yet trusted was served");
    let taken = reloads(&adapter, "ok");
    mount.update(d, "fixed.crt", "fixed.key", "bundle.crt");
    wait_for(WAIT, "the client CA bundle taken", || {
        (reloads(&adapter, "ok") > taken).then_some(())
    });
    let (ok, err) = get_as(&adapter.xds_url(), d, "new-ca-client");
    assert!(
        ok,
        "a client of the new CA after the bundle was taken: {err}"
    );
    let (ok, err) = get_as(&adapter.xds_url(), d, "client");
    assert!(ok, "a client of the old CA in the bundle: {err}");

    // Steady: nothing more is reloaded while the files stay as they are; the stream opened
    // first is still open (mcpctl --watch does not reconnect: it exits when its stream ends).
    let ok = reloads(&adapter, "ok");
    adapter.assert_steady(Duration::from_secs(2));
    assert_eq!(reloads(&adapter, "ok"), ok);
    assert_eq!(reloads(&adapter, "error"), 2.0);
    assert_eq!(
        adapter.metric_with(
            "mcp_adapter_tls_refused_connections_total",
            "reason=\"san_not_allowed\""
        ),
        0.0
    );
    assert_eq!(adapter.metric("mcp_adapter_connected_sinks"), 1.0);
    let mut watch = watch;
    assert!(
        watch.child.try_wait().expect("try_wait").is_none(),
        "the open stream ended"
    );
}
