//! Completes the TLS handshakes of accepted connections for tonic, each on its own task (one
//! slow or silent client holds up no other), and reports the clients refused.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use super::{cert, Tls, HANDSHAKE_TIMEOUT};
use crate::conn::{Conn, ConnInfo};

/// The connections of `conns` (accepted, counted against `--max-connections`) whose handshake
/// completed, until `shutdown`.
pub fn incoming<S>(
    conns: S,
    tls: Arc<Tls>,
    shutdown: CancellationToken,
) -> impl Stream<Item = Result<TlsStream<Conn>, std::io::Error>>
where
    S: Stream<Item = Result<Conn, std::io::Error>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut conns = std::pin::pin!(conns);
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = conns.next() => a,
            };
            let tcp = match accepted {
                None => return,
                Some(Ok(a)) => a,
                Some(Err(e)) => {
                    // Out of descriptors and the like: pass, and let the next accept retry.
                    tracing::warn!(error = %e, "Accepting a gRPC connection failed.");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let peer = ConnInfo::peer(Some(&tcp.connect_info()));
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                let handshake =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp)).await;
                let stream = match handshake {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return refused(&tls, &peer, &e),
                    Err(_) => {
                        let e = std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "handshake timed out",
                        );
                        return refused(&tls, &peer, &e);
                    }
                };
                check_sans(&tls, &stream, &peer);
                let _ = tx.send(Ok(stream)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Logs and counts a client whose certificate has no `--tls-client-san` name; its requests are
/// refused by [`super::authorize`], which can answer with a reason the client shows.
fn check_sans(tls: &Tls, stream: &TlsStream<Conn>, peer: &str) {
    let allow = &tls.settings.client_sans;
    if allow.is_empty() {
        return;
    }
    let presented = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(cert::presented_sans)
        .unwrap_or_default();
    if !allow.admits(&presented) {
        let sans: Vec<String> = presented.iter().map(ToString::to_string).collect();
        tls.metrics
            .tls_refused
            .with_label_values(&["san_not_allowed"])
            .inc();
        tracing::warn!(%peer, presented_sans = ?sans, allowed = %allow, "Refused a client: its certificate carries no name in --tls-client-san.");
    }
}

fn refused(tls: &Tls, peer: &str, error: &std::io::Error) {
    tls.metrics
        .tls_refused
        .with_label_values(&["handshake"])
        .inc();
    if error.kind() == std::io::ErrorKind::UnexpectedEof {
        // Load balancer and kubelet TCP probes connect and close without a handshake.
        tracing::debug!(%peer, %error, "A client left before the TLS handshake.");
    } else {
        tracing::warn!(%peer, %error, "TLS handshake failed (no client certificate, or one the client CAs did not sign?).");
    }
}
