//! Polls the TLS files and swaps in what changed, once it is checked usable.
//!
//! Polling the content (not watching for events) sees every way the files change: rewritten in
//! place by cert-manager's or another tool, or a Kubernetes secret mount re-pointing its
//! `..data` link, where the watched paths themselves never change. A new pair that is not usable
//! (unparsable, or a key that is not the certificate's, as while a tool has written one file
//! and not yet the other) is not served: the last good one stays, the error is logged naming the
//! file and `mcp_adapter_tls_reload_failing` is 1 until the files are usable again.

use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use xxhash_rust::xxh3::xxh3_64;

use super::cert::{self, CertError};
use super::{Tls, TlsSettings};

/// One reading of the TLS files.
#[derive(Debug)]
pub struct Files {
    cert: (std::path::PathBuf, Result<Vec<u8>, String>),
    key: (std::path::PathBuf, Result<Vec<u8>, String>),
    client_ca: Option<(std::path::PathBuf, Result<Vec<u8>, String>)>,
}

fn read(path: &Path) -> (std::path::PathBuf, Result<Vec<u8>, String>) {
    (
        path.to_path_buf(),
        std::fs::read(path).map_err(|e| format!("cannot read: {e}")),
    )
}

fn bytes((path, read): &(std::path::PathBuf, Result<Vec<u8>, String>)) -> Result<&[u8], CertError> {
    read.as_deref().map_err(|e| CertError {
        path: path.clone(),
        problem: e.clone(),
    })
}

/// What identifies a reading: its content, or the error reading it.
fn digest((_, read): &(std::path::PathBuf, Result<Vec<u8>, String>)) -> u64 {
    match read {
        Ok(b) => xxh3_64(b),
        Err(e) => xxh3_64(e.as_bytes()) ^ 1,
    }
}

impl Files {
    /// Reads every file `settings` names (a few KiB; errors are kept, not returned).
    pub fn read(settings: &TlsSettings) -> Self {
        Self {
            cert: read(&settings.cert),
            key: read(&settings.key),
            client_ca: settings.client_ca.as_deref().map(read),
        }
    }

    /// The certificate chain's bytes.
    pub fn cert(&self) -> Result<&[u8], CertError> {
        bytes(&self.cert)
    }

    /// The key's bytes.
    pub fn key(&self) -> Result<&[u8], CertError> {
        bytes(&self.key)
    }

    /// The client CA bundle's bytes, if one is configured.
    pub fn client_ca(&self) -> Result<Option<&[u8]>, CertError> {
        self.client_ca.as_ref().map(bytes).transpose()
    }

    fn pair_digest(&self) -> (u64, u64) {
        (digest(&self.cert), digest(&self.key))
    }

    fn ca_digest(&self) -> Option<u64> {
        self.client_ca.as_ref().map(digest)
    }
}

/// What was last tried, so that a bad file is reported once, not at every poll.
struct Seen {
    pair: (u64, u64),
    ca: Option<u64>,
    pair_failing: bool,
    ca_failing: bool,
}

/// Looks at the files every `--tls-reload-interval` until `shutdown`; `first` is the reading
/// [`Tls::start`] served.
pub async fn run(tls: Arc<Tls>, first: Files, shutdown: CancellationToken) {
    let mut seen = Seen {
        pair: first.pair_digest(),
        ca: first.ca_digest(),
        pair_failing: false,
        ca_failing: false,
    };
    let every = tls.settings.reload_every;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let settings = tls.settings.clone();
        let Ok(files) = tokio::task::spawn_blocking(move || Files::read(&settings)).await else {
            continue;
        };
        let mut results = Vec::new();
        if files.pair_digest() != seen.pair {
            seen.pair = files.pair_digest();
            seen.pair_failing = !reload_pair(&tls, &files);
            results.push(seen.pair_failing);
        }
        if files.ca_digest() != seen.ca {
            seen.ca = files.ca_digest();
            seen.ca_failing = !reload_client_ca(&tls, &files);
            results.push(seen.ca_failing);
        }
        // The gauge before the counters: whoever sees a count sees the state it left.
        tls.metrics
            .tls_reload_failing
            .set(i64::from(seen.pair_failing || seen.ca_failing));
        for failed in results {
            let result = if failed { "error" } else { "ok" };
            tls.metrics.tls_reloads.with_label_values(&[result]).inc();
        }
    }
}

/// Serves the new pair if it is usable; false (logged) if not.
fn reload_pair(tls: &Tls, files: &Files) -> bool {
    let pair = files.cert().and_then(|c| {
        let k = files.key()?;
        cert::served_pair(
            (&tls.settings.cert, c),
            (&tls.settings.key, k),
            &tls.provider,
        )
    });
    match pair {
        Ok(pair) => {
            tls.live.set_cert(pair.key);
            tls.metrics.tls_not_after.set(pair.not_after);
            tracing::info!(cert = %tls.settings.cert.display(), serial = %pair.serial, not_after = pair.not_after, "TLS certificate reloaded: new connections get it, open ones keep theirs.");
            true
        }
        Err(e) => failed(&e, "certificate"),
    }
}

/// Verifies new client certificates with the new CAs if they are usable; false if not.
fn reload_client_ca(tls: &Tls, files: &Files) -> bool {
    let (Some(path), Ok(Some(pem))) = (&tls.settings.client_ca, files.client_ca()) else {
        return match files.client_ca() {
            Err(e) => failed(&e, "client CA bundle"),
            Ok(_) => true,
        };
    };
    match cert::client_verifier(path, pem, &tls.provider) {
        Ok(verifier) => {
            tls.live.set_client_ca(verifier);
            tracing::info!(client_ca = %path.display(), "TLS client CAs reloaded.");
            true
        }
        Err(e) => failed(&e, "client CA bundle"),
    }
}

fn failed(e: &CertError, what: &str) -> bool {
    tracing::error!(file = %e.path.display(), error = %e.problem, "The changed TLS {what} is not usable; still serving the previous one.");
    false
}
