//! Handing a response to a stream's body, and the stream's unacknowledged-response timer.
//!
//! A sink that stops reading closes its flow-control window: the body stops taking pieces, its
//! one-slot channel fills, and the stream's task waits in the channel's `send`. What bounds a
//! stream must go on while it waits there, or such a sink holds its stream slot (and the
//! responses it references) forever: [`hand_over`] waits for the send, shutdown, the end of the
//! connection's age (`--max-connection-age` and its grace), the [`Unacked`] timer and a large
//! request's receive deadline (`--request-receive-timeout`: the body is not read meanwhile, so
//! its own check would never run, and the request's share of the budget would be held for the
//! connection's age) at once.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::frames::Encoded;
use super::limits::Refused;
use super::request_body::Receiving;
use super::response_body::Sent;

/// Whether a stream counts in `mcp_adapter_unacked_responses` (its oldest unacknowledged
/// response is older than `--unacked-threshold`), and when it would start to.
#[derive(Debug)]
pub(crate) struct Unacked {
    gauge: IntGauge,
    threshold: Duration,
    counted: bool,
    due: Option<Instant>,
}

impl Unacked {
    /// A stream not counted, in `gauge`.
    pub(crate) fn new(gauge: IntGauge, threshold: Duration) -> Self {
        Self {
            gauge,
            threshold,
            counted: false,
            due: None,
        }
    }

    /// Counts the stream or not, given when its oldest unacknowledged response was sent.
    pub(crate) fn update(&mut self, oldest: Option<std::time::Instant>) {
        self.due = None;
        match oldest.map(|sent| Instant::from_std(sent) + self.threshold) {
            Some(due) if due <= Instant::now() => {
                if !self.counted {
                    self.gauge.inc();
                    self.counted = true;
                }
            }
            due => {
                if self.counted {
                    self.gauge.dec();
                    self.counted = false;
                }
                self.due = due;
            }
        }
    }

    /// When [`Unacked::update`] must run again (the oldest response would pass the threshold).
    pub(crate) fn due(&self) -> Option<Instant> {
        self.due
    }
}

impl Drop for Unacked {
    fn drop(&mut self) {
        if self.counted {
            self.gauge.dec();
        }
    }
}

/// Waits until `at`, or forever if `None`.
pub(crate) async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How a hand-over ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Handed {
    /// The body took the response.
    Taken,
    /// The body is gone (the sink left).
    Gone,
    /// The adapter shuts down.
    Shutdown,
    /// The connection is past its age and grace while the sink does not read: the stream
    /// ends without a farewell (there is no room for one).
    Aged,
    /// A large request's receive deadline passed meanwhile.
    Late(Refused),
}

/// Hands `resp` to the stream's body; meanwhile the stream counts as unacknowledged when its
/// oldest response (`oldest`, the engine's) passes the threshold, and ends at `age_end` or
/// shutdown.
pub(crate) async fn hand_over<F: Future<Output = ()>>(
    tx: &mpsc::Sender<Sent>,
    resp: Encoded,
    shutdown: &CancellationToken,
    mut age_end: Pin<&mut F>,
    unacked: &mut Unacked,
    oldest: Option<std::time::Instant>,
    receiving: &mut Receiving,
) -> Handed {
    unacked.update(oldest);
    let send = tx.send(Ok(resp));
    tokio::pin!(send);
    loop {
        tokio::select! {
            sent = &mut send => return if sent.is_ok() { Handed::Taken } else { Handed::Gone },
            _ = shutdown.cancelled() => return Handed::Shutdown,
            () = &mut age_end => return Handed::Aged,
            () = until(unacked.due()) => unacked.update(oldest),
            refused = receiving.late() => return Handed::Late(refused),
        }
    }
}
