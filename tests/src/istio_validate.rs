//! Istio's own ServiceEntry validation as a test oracle: one `istio-validate` process per test
//! binary (`tests/istio-validate`, built by `tests/go-peers/build.sh target` into
//! `target/istio/istio-validate`, or `$ISTIO_VALIDATE`), spawned on first use, that runs
//! `validation.ValidateServiceEntry` (what the admission webhook and istiod's config stores run)
//! over each entry.
//!
//! The sinks every test shares pass what they receive through [`assert_valid`], so each end-to-end
//! test also asserts that the adapters never serve an entry Istio refuses: istiod drops such an
//! entry without telling the source, so nothing else in a test would notice.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use prost::Message;
use proto::istio::networking::v1alpha3::ServiceEntry;
use serde::Deserialize;
use serde_json::json;

/// Istio's answer for one ServiceEntry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Verdict {
    /// No errors (warnings allowed): the webhook admits it, istiod keeps it.
    pub valid: bool,
    /// Why Istio refuses it, one message each.
    pub errors: Vec<String>,
    /// What Istio warns about (the entry is still accepted).
    pub warnings: Vec<String>,
}

/// The validator binary: `$ISTIO_VALIDATE` (a full path), else `target/istio/istio-validate`.
pub fn binary() -> PathBuf {
    crate::peer_file(
        "ISTIO_VALIDATE",
        "istio/istio-validate",
        "`tests/go-peers/build.sh target`",
    )
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn spawn() -> Peer {
        let path = binary();
        let mut child = Command::new(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", path.display()));
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            panic!("{}: no pipes", path.display());
        };
        Peer {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        }
    }

    /// Sends `lines` and reads one verdict per line. In chunks, so that neither pipe fills up
    /// while the other side waits (the peer answers a line as soon as it has read it).
    fn ask(&mut self, lines: &[String]) -> Result<Vec<Verdict>, String> {
        let mut out = Vec::with_capacity(lines.len());
        for chunk in lines.chunks(128) {
            let mut batch = String::new();
            for l in chunk {
                batch.push_str(l);
                batch.push('\n');
            }
            self.stdin
                .write_all(batch.as_bytes())
                .and_then(|()| self.stdin.flush())
                .map_err(|e| format!("write: {e}"))?;
            for _ in chunk {
                let mut line = String::new();
                match self.stdout.read_line(&mut line) {
                    Ok(0) => return Err("istio-validate exited".into()),
                    Ok(_) => {
                        out.push(serde_json::from_str(&line).map_err(|e| format!("{line:?}: {e}"))?)
                    }
                    Err(e) => return Err(format!("read: {e}")),
                }
            }
        }
        Ok(out)
    }
}

static PEER: Mutex<Option<Peer>> = Mutex::new(None);

/// Asks the (lazily started) peer; one restart if it died, since a test binary's tests share it.
fn ask(lines: &[String]) -> Vec<Verdict> {
    let mut peer = PEER.lock().unwrap_or_else(|e| e.into_inner());
    let mut last = String::new();
    for _ in 0..2 {
        let p = peer.get_or_insert_with(Peer::spawn);
        match p.ask(lines) {
            Ok(v) => return v,
            Err(e) => {
                last = e;
                let _ = p.child.kill();
                let _ = p.child.wait();
                *peer = None;
            }
        }
    }
    panic!("istio-validate: {last}");
}

fn request_bytes(name: &str, namespace: &str, se: &ServiceEntry) -> String {
    json!({
        "name": name,
        "namespace": namespace,
        "spec_b64": base64(&se.encode_to_vec()),
    })
    .to_string()
}

/// Istio's verdict on `se` as `namespace/name`.
pub fn verdict(name: &str, namespace: &str, se: &ServiceEntry) -> Verdict {
    verdicts(&[(name, namespace, se)]).remove(0)
}

/// Istio's verdicts on many entries at once, in order: one round trip per 128.
pub fn verdicts(entries: &[(&str, &str, &ServiceEntry)]) -> Vec<Verdict> {
    let lines: Vec<String> = entries
        .iter()
        .map(|(n, ns, se)| request_bytes(n, ns, se))
        .collect();
    ask(&lines)
}

/// Istio's verdict on a spec in protojson form (istiod's configz, kubectl's output).
pub fn verdict_json(name: &str, namespace: &str, spec: &serde_json::Value) -> Verdict {
    let line = json!({"name": name, "namespace": namespace, "spec": spec}).to_string();
    ask(&[line]).remove(0)
}

/// Panics, naming the entry, Istio's errors and `context`, when Istio refuses `se`.
pub fn assert_valid(context: &str, name: &str, namespace: &str, se: &ServiceEntry) {
    if let Err(e) = check_once(name, namespace, &se.encode_to_vec(), || {
        verdict(name, namespace, se)
    }) {
        panic!("{context}: {e}");
    }
}

/// [`assert_valid`] for a protojson spec.
pub fn assert_valid_json(context: &str, name: &str, namespace: &str, spec: &serde_json::Value) {
    let key = spec.to_string().into_bytes();
    if let Err(e) = check_once(name, namespace, &key, || {
        verdict_json(name, namespace, spec)
    }) {
        panic!("{context}: {e}");
    }
}

/// Entries already found valid, by name and encoding: SotW sinks get every entry again in each
/// response, and a test's polls read the same configz many times.
static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

/// `namespace/name` and the entry's encoding.
type Seen = HashSet<(String, Vec<u8>)>;

/// `Err` (a message naming the entry and Istio's errors) unless `ask` says valid; skips entries
/// seen valid before.
pub fn check_once(
    name: &str,
    namespace: &str,
    encoded: &[u8],
    ask: impl FnOnce() -> Verdict,
) -> Result<(), String> {
    let key = (format!("{namespace}/{name}"), encoded.to_vec());
    if SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(&key))
    {
        return Ok(());
    }
    let v = ask();
    if !v.valid {
        return Err(format!(
            "served ServiceEntry {namespace}/{name} that Istio's ValidateServiceEntry refuses: {:?}",
            v.errors
        ));
    }
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(key);
    Ok(())
}

/// Standard base64 with padding (what Go's `base64.StdEncoding` reads).
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(c.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(c.get(2).copied().unwrap_or(0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(char::from(ABC[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
        assert_eq!(base64(b"fooba"), "Zm9vYmE=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
