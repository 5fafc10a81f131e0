//! A private network namespace per traffic test, like a pod's: its own loopback, its own ports
//! (a sidecar binds service ports on 127.0.0.1, so two tests with sidecars would otherwise
//! collide), a "pod network" of local addresses for the backends, and the iptables capture an
//! Istio init container sets up. Nothing in it can reach or be reached from outside.
//!
//! Why not plain loopback: Kubernetes refuses EndpointSlice addresses in 127.0.0.0/8, so a
//! service in another cluster needs backends on addresses that look like pod IPs; and capturing
//! a service VIP needs iptables, which must not touch the machine's own tables.
//!
//! A test (or bench) calls [`isolate`] first: outside the namespace it runs itself again inside
//! a new one (`unshare --net`, as root; `unshare --user --map-root-user --net` otherwise) and
//! reports the result; inside, it sets the namespace up and the test goes on.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

/// The backends' network: `10.77.0.0/16`, every address local to the namespace.
pub fn pod_ip(subnet: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, subnet, host)
}

/// The block the adapters take service VIPs from (`--vip-cidr` defaults: 242.1-5.0.0/16).
const VIP_BLOCK: &str = "242.0.0.0/8";

/// The port a REDIRECT-mode sidecar receives captured outbound connections on.
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;

const ENV: &str = "E2E_NETNS";
const MARKER: &str = "E2E_NETNS_MARKER";

/// Runs `args` (this executable's arguments that select the one test or bench to run: for a
/// test, its name plus `--exact --include-ignored --nocapture`) in a new network namespace
/// named `name`. Returns `true` when called inside it (after setting it up: the caller goes on)
/// and `false` outside, once the run inside has passed (it panics when that run failed or did
/// not reach this call).
pub fn isolate_args(name: &str, args: &[String]) -> bool {
    if std::env::var(ENV).as_deref() == Ok(name) {
        setup();
        if let Some(marker) = std::env::var_os(MARKER) {
            std::fs::write(marker, name).expect("write netns marker");
        }
        return true;
    }
    let marker_dir = tempfile::tempdir().expect("tempdir");
    let marker: PathBuf = marker_dir.path().join("entered");
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = Command::new("unshare");
    if !is_root() {
        // Without root: a user namespace that maps us to root inside, which may own a network
        // namespace (unprivileged user namespaces must be enabled).
        cmd.args(["--user", "--map-root-user"]);
    }
    let status = cmd
        .args(["--net", "--"])
        .arg(&exe)
        .args(args)
        .env(ENV, name)
        .env(MARKER, &marker)
        .status()
        .unwrap_or_else(|e| panic!("run unshare (util-linux) for {name}: {e}"));
    assert!(
        status.success(),
        "{name} failed inside its network namespace ({status}); its output is above"
    );
    assert!(
        marker.exists(),
        "{name}: the run inside the network namespace never reached isolate({name:?}): \
         wrong test name?"
    );
    false
}

/// [`isolate_args`] for the `#[test]` function `test` (its name, as `cargo test` filters).
pub fn isolate(test: &str) -> bool {
    isolate_args(
        test,
        &[
            test.to_string(),
            "--exact".into(),
            "--include-ignored".into(),
            "--nocapture".into(),
            "--test-threads".into(),
            "1".into(),
        ],
    )
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Loopback up; the pod network and the VIP block local (any address in them can be bound and
/// reached, like an interface's own address); connections to a VIP redirected to the sidecar's
/// capture port, as istio-init does for a pod (only the VIP block here: the sidecars of these
/// tests reach everything else directly).
fn setup() {
    run("ip", &["link", "set", "lo", "up"]);
    run(
        "ip",
        &["route", "add", "local", "10.77.0.0/16", "dev", "lo"],
    );
    run("ip", &["route", "add", "local", VIP_BLOCK, "dev", "lo"]);
    run(
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            VIP_BLOCK,
            "-j",
            "REDIRECT",
            "--to-ports",
            &OUTBOUND_CAPTURE_PORT.to_string(),
        ],
    );
}

/// Runs a network tool, from the PATH or /usr/sbin and /sbin (root's tools are there and a
/// test's PATH may not have them).
fn run(tool: &str, args: &[&str]) {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|dir| PathBuf::from(dir).join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{tool} not found: install it (scripts/install-iptables.sh installs iptables; \
                 `ip` is Debian's iproute2)"
            )
        });
    let out = Command::new(&found)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", found.display()));
    assert!(
        out.status.success(),
        "{} {}: {}",
        found.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
