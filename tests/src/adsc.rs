//! Istio's own MCP client (`adsc-watch`: `pkg/adsc` and istiod's in-memory config store) as a
//! test peer, printing what it stores as JSON events; and a macro that runs one scenario with
//! each Istio build.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::{endpoint_addresses, item, peer_binary, process, Adapter};

/// Which build of Istio's client.
#[derive(Clone, Copy, Debug)]
pub enum IstioVersion {
    /// Istio 1.31-dev (requests `networking.istio.io/v1/ServiceEntry`).
    Current,
    /// Istio 1.22 (requests `networking.istio.io/v1alpha3/ServiceEntry`).
    V1_22,
}

/// Istio's own MCP-over-xDS client (`pkg/adsc` + istiod's in-memory config store) watching a
/// server, as JSON events.
pub struct Adsc {
    child: Child,
    events: mpsc::Receiver<serde_json::Value>,
    /// Every event seen so far.
    pub seen: Vec<serde_json::Value>,
}

impl Adsc {
    /// Starts `adsc-watch` against `addr`.
    pub fn start(version: IstioVersion, addr: SocketAddr) -> Adsc {
        let name = match version {
            IstioVersion::Current => "adsc-watch-current",
            IstioVersion::V1_22 => "adsc-watch-1.22",
        };
        let bin = peer_binary(
            "ADSC_WATCH_DIR",
            "adsc",
            name,
            "tests/istio-adsc/build.sh target/adsc",
        );
        let mut child = process::spawn_piped(
            Command::new(bin).args(["--addr", &addr.to_string(), "--timeout", "300s"]),
            Stdio::null(),
        );
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Adsc {
            child,
            events: rx,
            seen: Vec::new(),
        }
    }

    /// Waits until `adapter` is ready, starts `adsc-watch` against it and waits until it has
    /// synced (the `synced` event is the last of [`Adsc::seen`]).
    pub fn start_synced(version: IstioVersion, adapter: &Adapter) -> Adsc {
        adapter.wait_ready();
        let mut adsc = Adsc::start(version, adapter.grpc);
        adsc.wait(Duration::from_secs(60), "adsc synced", |e| {
            e["event"] == "synced"
        });
        adsc
    }

    /// Waits for an event satisfying `pred`; panics with everything seen on timeout.
    pub fn wait(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(ev) => {
                    self.record(ev.clone());
                    if pred(&ev) {
                        return ev;
                    }
                }
                Err(_) => panic!(
                    "timed out after {timeout:?} waiting for {what}; adsc events:\n{}",
                    self.seen
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            }
        }
    }

    /// Waits for a `serviceentries` event satisfying `pred` on its items.
    pub fn wait_items(
        &mut self,
        what: &str,
        pred: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let ev = self.wait(Duration::from_secs(30), what, |ev| {
            ev["event"] == "serviceentries"
                && ev["items"].as_array().is_some_and(|items| pred(items))
        });
        ev["items"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `main` (`namespace/name`) has `endpoints` endpoints and each of `others` is
    /// stored too; asserts that nothing else is. The items.
    pub fn wait_exactly(
        &mut self,
        main: &str,
        endpoints: usize,
        others: &[&str],
    ) -> Vec<serde_json::Value> {
        let what = format!("{main} with {endpoints} endpoints, and {others:?}");
        let items = self.wait_items(&what, |items| {
            item(items, main).is_some_and(|m| endpoint_addresses(m).len() == endpoints)
                && others.iter().all(|o| item(items, o).is_some())
        });
        assert_eq!(items.len(), 1 + others.len(), "{items:?}");
        items
    }

    /// Keeps `ev` in [`Adsc::seen`]; panics on an `invalid` event: the store held a ServiceEntry
    /// that Istio's own validation refuses, which an adapter must never serve.
    fn record(&mut self, ev: serde_json::Value) {
        assert!(
            ev["event"] != "invalid",
            "Istio's ValidateServiceEntry refuses a ServiceEntry adsc holds: {ev}"
        );
        self.seen.push(ev);
    }

    /// `error` events seen so far.
    pub fn errors(&self) -> Vec<&serde_json::Value> {
        self.seen.iter().filter(|e| e["event"] == "error").collect()
    }

    /// Asserts that Istio's client reported no error so far, including in the events that
    /// arrived after the last one waited for.
    pub fn assert_no_errors(&mut self) {
        while let Ok(ev) = self.events.try_recv() {
            self.record(ev);
        }
        assert!(
            self.errors().is_empty(),
            "adsc reported errors: {:?}",
            self.errors()
        );
    }
}

impl Drop for Adsc {
    fn drop(&mut self) {
        // The events after the last one a test waited for are checked too.
        if !std::thread::panicking() {
            while let Ok(ev) = self.events.try_recv() {
                self.record(ev);
            }
        }
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two tests, `$current` and `$v1_22`, each running `$scenario` with that build of Istio's
/// client ([`IstioVersion`]), both ignored for `$why` (the peers they need):
///
/// ```text
/// test_each_istio_version! {
///     "needs ...",
///     istio_current_reads_x, istio_1_22_reads_x => scenario
/// }
/// ```
#[macro_export]
macro_rules! test_each_istio_version {
    ($why:literal, $current:ident, $v1_22:ident => $scenario:ident) => {
        #[test]
        #[ignore = $why]
        fn $current() {
            $scenario($crate::IstioVersion::Current);
        }

        #[test]
        #[ignore = $why]
        fn $v1_22() {
            $scenario($crate::IstioVersion::V1_22);
        }
    };
}
