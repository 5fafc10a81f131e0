//! Harness for the end-to-end tests: starts the adapters' real binaries on free loopback ports
//! and real peers (Istio's own MCP client `adsc-watch`, built by `tests/istio-adsc/build.sh`).
//!
//! Binaries are found next to the test executable (`target/<profile>/`), which `cargo test
//! --workspace` builds; the Istio peers in `$ADSC_WATCH_DIR` (default `target/adsc`).

mod adapter;
mod adsc;
pub mod backend;
pub mod background;
pub mod compose;
pub mod consul;
pub mod cut_proxy;
pub mod envoy;
pub mod eureka;
pub mod flood;
pub mod forwarder;
pub mod helm;
pub mod istio_validate;
pub mod istiod;
pub mod kube;
pub mod kube_output;
pub mod load;
pub mod mesh;
pub mod nacos;
pub mod nacos_clients;
pub mod netns;
pub mod pki;
pub mod podman;
pub mod process;
pub mod prometheus;
pub mod registries;
pub mod soak;
pub mod stall_proxy;
pub mod tls_proxy;
pub mod xds_sinks;
pub mod zk_ensemble;
pub mod zookeeper;
pub mod ztunnel;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use adapter::Adapter;
pub use adsc::{Adsc, IstioVersion};
pub use process::Process;

/// `target/<profile>` of this build.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test-binary>
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target/debug"))
}

/// A workspace binary (`adapter-file`, `mcpctl`), built from the sources as they are now:
/// `cargo test -p e2e` builds the tests, not the binaries they run, so after an edit a test
/// would otherwise run the binary built before it.
pub fn workspace_bin(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        p.display()
    );
    static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if !checked.iter().any(|c| c == name) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new("/"));
        if let Some(newer) = newer_source(&p, root) {
            panic!(
                "{} is older than {}, one of the sources it is built from: run `cargo build -p {name}` \
                 (or `cargo build --workspace --bins`) first; `cargo test -p e2e` does not \
                 rebuild the binaries the tests run",
                p.display(),
                newer.display()
            );
        }
        checked.push(name.to_string());
    }
    p
}

/// A source file of `bin` (from the dependency list cargo writes beside it, `<bin>.d`) under
/// `root` (not under its `target/`) that was changed after `bin` was built. None when the list
/// is missing.
pub fn newer_source(bin: &Path, root: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(bin).and_then(|m| m.modified()).ok()?;
    let list = std::fs::read_to_string(bin.with_extension("d")).ok()?;
    // `<bin>: <dep> <dep> ...`, spaces in paths escaped with a backslash.
    let (_, deps) = list.split_once(": ")?;
    let deps = deps.trim().replace("\\ ", "\u{0}");
    deps.split_whitespace()
        .map(|d| PathBuf::from(d.replace('\u{0}', " ")))
        // Generated files (a build script's output under target/) are not sources.
        .filter(|d| d.starts_with(root) && !d.starts_with(root.join("target")))
        .find(|d| {
            std::fs::metadata(d)
                .and_then(|m| m.modified())
                .is_ok_and(|changed| changed > built)
        })
}

/// `n` consecutive free ports on 127.0.0.1, first address returned (an adapter with
/// `--shards n` listens on the `--listen` port and the `n - 1` after it).
pub fn free_addrs(n: u16) -> SocketAddr {
    for _ in 0..1000 {
        let first = free_addr();
        let all_free = (1..n).all(|i| {
            first
                .port()
                .checked_add(i)
                .is_some_and(|p| TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], p))).is_ok())
        });
        if all_free {
            // The ports after the first are not handed out by `free_addr` again soon: its
            // counter moves on past them.
            for _ in 1..n {
                let _ = free_addr();
            }
            return first;
        }
    }
    panic!("no {n} consecutive free ports on 127.0.0.1");
}

/// A free loopback port for a peer to listen on, from below the kernel's ephemeral range.
///
/// Not `bind(0)`: that hands out a port from the ephemeral range, which every outgoing
/// connection draws from too, so a peer that takes seconds to bind (a JVM) could find its port
/// taken by some client's connection meanwhile (seen: Eureka "Port ... was already in use" while
/// other peers started beside it). Ports here come from a range no connection uses, each handed
/// out once per process (a counter), and only if nothing listens on it now.
pub fn free_addr() -> SocketAddr {
    free_addr_with(&[0])
}

/// Ports handed out by [`free_addr_with`] beside the one it returns: never handed out again.
static RESERVED: std::sync::Mutex<std::collections::BTreeSet<u32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// [`free_addr`] for a peer that listens on several ports at fixed distances from the one it is
/// given (Nacos: `P`, `P + 1000`, `P + 1001`, `P - 1000`): a port `P` such that `P + offset`
/// is free for every offset, all in the range [`free_addr`] draws from. The other ports are
/// reserved: this process hands none of them out again.
pub fn free_addr_with(offsets: &[i32]) -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // The ephemeral range (`32768 60999` by default); ours is the 11,000 ports below it, above
    // the service ports that tests give their sidecars (18080, 20880, 15001, ...).
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (base, size) = if low > 32000 {
        (low - 11000, 11000)
    } else {
        (61000, 4500)
    };
    // Each process starts elsewhere in the range, so test binaries run one after another do not
    // retry the ports their predecessors' leftovers may hold.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % size,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let mut reserved = RESERVED.lock().unwrap_or_else(|p| p.into_inner());
    let bindable = |port: u32| {
        u16::try_from(port)
            .is_ok_and(|p| TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], p))).is_ok())
    };
    for _ in 0..size {
        let port = base + NEXT.fetch_add(1, Ordering::SeqCst) % size;
        let all: Option<Vec<u32>> = offsets
            .iter()
            .map(|o| port.checked_add_signed(*o))
            .map(|p| p.filter(|p| (base..base + size).contains(p)))
            .collect();
        let Some(all) = all else {
            continue;
        };
        if all.iter().all(|p| !reserved.contains(p) && bindable(*p)) {
            reserved.extend(all.iter().filter(|p| **p != port));
            return SocketAddr::from(([127, 0, 0, 1], port as u16));
        }
    }
    panic!(
        "no free ports at {offsets:?} from one in 127.0.0.1:{base}-{}",
        base + size - 1
    );
}

/// Minimal HTTP GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http(addr, "GET", path, &[], "")
}

/// Minimal HTTP/1.0 request: (status, body).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.0\r\nHost: test\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// HTTP/1.1 GET with `Connection: close` (for servers that refuse HTTP/1.0, like Envoy's admin
/// port): (status, body), a chunked body decoded.
pub fn http11_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut body = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, String::from_utf8_lossy(body).into_owned()));
    }
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| std::io::Error::other("bad chunk"))?;
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&body[..line_end])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .map_err(std::io::Error::other)?;
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        let chunk = body
            .get(start..start + size)
            .ok_or_else(|| std::io::Error::other("short chunk"))?;
        out.extend_from_slice(chunk);
        body = body.get(start + size + 2..).unwrap_or_default();
    }
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

pub use mcp_core::testing::metric_sum;

/// Polls `f` every 50 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `probe` every 100 ms until it is `Ok`, for at most `timeout`; panics with the last
/// `Err` (what was seen instead), which [`wait_for`] cannot say.
pub fn settle<T>(timeout: Duration, what: &str, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let end = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(seen) => {
                assert!(
                    Instant::now() < end,
                    "timed out after {timeout:?} waiting for {what}; last seen:\n{seen}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// A test peer's binary `name` in the directory `$env` names (default `target/<default_dir>`),
/// which the command `build` makes; panics with that hint when it is missing.
pub fn peer_binary(env: &str, default_dir: &str, name: &str, build: &str) -> PathBuf {
    let dir = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| beside_target_dir(default_dir));
    require_peer(dir.join(name), build)
}

/// A test peer's file: the path `$env` names, else `target/<default_path>`, which the command
/// `build` makes; panics with that hint when it is missing.
pub fn peer_file(env: &str, default_path: &str, build: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| beside_target_dir(default_path));
    require_peer(path, build)
}

/// `target/<path>` (beside `target/<profile>`).
fn beside_target_dir(path: &str) -> PathBuf {
    target_dir()
        .parent()
        .map(|t| t.join(path))
        .unwrap_or_default()
}

fn require_peer(path: PathBuf, build: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{} missing: build it with {build} (the README's test command does)",
        path.display()
    );
    path
}

/// Finds an item by `namespace/name`.
pub fn item<'a>(items: &'a [serde_json::Value], ns_name: &str) -> Option<&'a serde_json::Value> {
    items.iter().find(|i| {
        format!(
            "{}/{}",
            i["namespace"].as_str().unwrap_or(""),
            i["name"].as_str().unwrap_or("")
        ) == ns_name
    })
}

/// The resourceVersion of item `ns_name` (as adsc prints it); panics when it is missing.
pub fn version_of(items: &[serde_json::Value], ns_name: &str) -> serde_json::Value {
    item(items, ns_name).unwrap_or_else(|| panic!("{ns_name} missing: {items:?}"))
        ["resourceVersion"]
        .clone()
}

/// The endpoint addresses of a ServiceEntry item (as adsc or mcpctl print it), sorted.
pub fn endpoint_addresses(item: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = item["spec"]["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Runs `cmd` to its end; panics, with `what` and its stderr, unless it succeeds. Its output.
pub fn run_ok(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `mcpctl get serviceentries -o json` against `server` (`xds://...`): the items.
pub fn mcpctl_get(server: &str) -> Vec<serde_json::Value> {
    let out = run_ok(
        Command::new(workspace_bin("mcpctl")).args([
            "get",
            "serviceentries",
            "--server",
            server,
            "-o",
            "json",
            "--timeout",
            "5s",
        ]),
        "mcpctl",
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("mcpctl JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// What `xds` serves (through mcpctl, as a sink sees it) once `pred` holds, within `timeout`.
pub fn wait_served(
    timeout: Duration,
    what: &str,
    xds: &str,
    pred: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    wait_for(timeout, what, || {
        let items = mcpctl_get(xds);
        pred(&items).then_some(items)
    })
}

/// The sorted endpoint addresses of the mcpctl item named `name`, if it is served.
pub fn addresses_of(items: &[serde_json::Value], name: &str) -> Option<Vec<String>> {
    find(items, name).map(endpoint_addresses)
}

/// A ServiceEntry file for adapter-file: `ns/<name>`, host `<name>.example.com`, HTTP port 80,
/// one endpoint at `ip`.
pub fn service_entry_yaml(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  hosts: [{name}.example.com]\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{{address: {ip}}}]\n"
    )
}

/// `namespace/name` of an object with Kubernetes metadata (an mcpctl item, an istiod config).
pub fn ns_name(object: &serde_json::Value) -> String {
    format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// `namespace/name` of mcpctl items.
pub fn item_names(items: &[serde_json::Value]) -> Vec<String> {
    items.iter().map(ns_name).collect()
}

/// The mcpctl item named `name` (short name).
pub fn find<'a>(items: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    items.iter().find(|i| i["metadata"]["name"] == name)
}

/// The last `lines` lines of `s`.
pub fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `(number, name, protocol)` of each port of a ServiceEntry item (as adsc or mcpctl print it).
pub fn ports(item: &serde_json::Value) -> Vec<(u64, String, String)> {
    item["spec"]["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["number"].as_u64().unwrap_or(0),
                        p["name"].as_str().unwrap_or("").to_string(),
                        p["protocol"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `(number, protocol)` of each port of a ServiceEntry item.
pub fn port_protocols(item: &serde_json::Value) -> Vec<(u64, String)> {
    ports(item).into_iter().map(|(n, _, p)| (n, p)).collect()
}

/// Standard base64 with padding (a basic-auth header, a kubeconfig's inline CA; no crate needed).
pub fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod stale_binary_tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn a_source_changed_after_the_binary_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let (bin, src, spaced) = (
            root.join("adapter-x"),
            root.join("main.rs"),
            root.join("a dir/lib.rs"),
        );
        std::fs::create_dir_all(root.join("a dir")).expect("mkdir");
        for f in [&bin, &src, &spaced] {
            std::fs::write(f, "x").expect("write");
        }
        let dep_list = format!(
            "{}: {} {} /elsewhere/other.rs\n",
            bin.display(),
            src.display(),
            spaced.display().to_string().replace(' ', "\\ ")
        );
        std::fs::write(bin.with_extension("d"), dep_list).expect("write .d");
        let at = |f: &Path, t: SystemTime| {
            std::fs::File::options()
                .write(true)
                .open(f)
                .and_then(|h| h.set_modified(t))
                .expect("set mtime");
        };
        let t0 = SystemTime::now() - Duration::from_secs(100);
        at(&src, t0);
        at(&spaced, t0);
        at(&bin, t0 + Duration::from_secs(10));
        assert_eq!(newer_source(&bin, root), None, "built after its sources");
        at(&spaced, t0 + Duration::from_secs(20));
        assert_eq!(
            newer_source(&bin, root),
            Some(spaced.clone()),
            "a path with a space"
        );
        at(&spaced, t0);
        at(&src, t0 + Duration::from_secs(20));
        assert_eq!(newer_source(&bin, root), Some(src));
        std::fs::remove_file(bin.with_extension("d")).expect("rm");
        assert_eq!(newer_source(&bin, root), None, "no list: not checked");
    }
}
