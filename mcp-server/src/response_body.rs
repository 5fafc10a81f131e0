//! The HTTP/2 response body of one stream: the responses its task hands over, written as
//! [`Chunks`], then the gRPC status in trailers.
//!
//! The transport asks for the next piece only when the stream has flow-control room, so a sink
//! that stops reading holds this body at its current piece: what it costs is that piece, the
//! response it belongs to (which shares the cache's bytes) and the channel's one slot. The
//! transport keeps a body it does not poll until the connection closes, which a sink that
//! still answers pings never lets happen: when the stream's task gives up on such a sink it
//! empties the body through its [`Emptier`], so that only the piece already handed to the
//! transport stays.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tonic::Status;

use super::frames::{Chunks, Encoded};

/// What a stream's task sends to its body.
pub type Sent = Result<Encoded, Status>;

/// What the body holds, shared with its [`Emptier`].
#[derive(Debug)]
struct Inner {
    rx: mpsc::Receiver<Sent>,
    current: Option<Chunks>,
    /// Status to end with (set by an error from the task).
    status: Option<Status>,
    ended: bool,
}

/// Body of one streaming response.
#[derive(Debug)]
pub struct ResponseBody {
    inner: Arc<Mutex<Inner>>,
}

/// Lets the stream's task drop what its body holds (see the module docs).
#[derive(Debug)]
pub struct Emptier(Weak<Mutex<Inner>>);

impl Emptier {
    /// Drops the response being written and the one waiting in the channel; the body ends with
    /// `status` if the transport ever polls it again.
    pub fn empty(&self, status: Status) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let mut inner = inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.current = None;
        inner.rx.close();
        while inner.rx.try_recv().is_ok() {}
        inner.status = Some(status);
    }

    /// [`Emptier::empty`] after `delay`, unless the body ended (and was dropped) by then: the
    /// time a sink that still reads has to take what was handed over.
    pub fn empty_after(self, delay: Duration, status: Status) {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let ended = self
                .0
                .upgrade()
                .is_none_or(|i| i.lock().unwrap_or_else(PoisonError::into_inner).ended);
            if !ended {
                self.empty(status);
            }
        });
    }
}

impl ResponseBody {
    /// A body fed by `rx`; it ends (status OK) when every sender is gone.
    pub fn new(rx: mpsc::Receiver<Sent>) -> Self {
        let inner = Inner {
            rx,
            current: None,
            status: None,
            ended: false,
        };
        Self {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    /// The handle that empties this body.
    pub fn emptier(&self) -> Emptier {
        Emptier(Arc::downgrade(&self.inner))
    }
}

impl Inner {
    fn trailers(&mut self) -> HeaderMap {
        let status = self.status.take().unwrap_or_else(|| Status::ok(""));
        let mut map = HeaderMap::new();
        map.insert("grpc-status", HeaderValue::from(status.code() as i32));
        if !status.message().is_empty() {
            // grpc-message is percent-encoded; keep it to the safe ASCII subset.
            let msg: String = status
                .message()
                .chars()
                .map(|c| {
                    if c.is_ascii_graphic() && c != '%' || c == ' ' {
                        c
                    } else {
                        '?'
                    }
                })
                .collect();
            if let Ok(v) = HeaderValue::from_str(&msg) {
                map.insert("grpc-message", v);
            }
        }
        map
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Uncontended but for the moment an emptier runs: one lock per piece.
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let this = &mut *guard;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            if let Some(chunks) = this.current.as_mut() {
                if let Some(piece) = chunks.next() {
                    return Poll::Ready(Some(Ok(Frame::data(piece))));
                }
                this.current = None;
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(encoded))) => match encoded.chunks() {
                    Ok(chunks) => this.current = Some(chunks),
                    Err(e) => this.status = Some(Status::resource_exhausted(e.to_string())),
                },
                Poll::Ready(Some(Err(status))) => this.status = Some(status),
                Poll::Ready(None) => {}
                Poll::Pending => return Poll::Pending,
            }
            if this.current.is_none() {
                // The task is gone, or it (or the framing) ended the stream with a status.
                this.ended = true;
                this.rx.close();
                return Poll::Ready(Some(Ok(Frame::trailers(this.trailers()))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Outgoing;
    use crate::protocol::{Protocol, Xds};
    use mcp_core::testing::mk_entry;
    use std::future::poll_fn;

    fn response(entries: &[Arc<mcp_core::cache::Entry>]) -> Encoded {
        Xds::response(Outgoing {
            type_key: "networking.istio.io/v1/ServiceEntry".into(),
            version: "1".into(),
            nonce: "1".into(),
            resources: entries.to_vec(),
            removed: Vec::new(),
            incremental: false,
            served: true,
        })
    }

    /// #33 item 3: a body the transport stopped polling (its sink stopped reading), one
    /// response half written and one waiting in the channel, keeps none of their entries once
    /// emptied, and ends with the status it was given.
    #[tokio::test]
    async fn an_emptied_body_keeps_no_response() {
        let held = [mk_entry("ns/a", "1"), mk_entry("ns/b", "1")];
        let (tx, rx) = mpsc::channel(1);
        let mut body = ResponseBody::new(rx);
        let emptier = body.emptier();
        tx.send(Ok(response(&held))).await.expect("taken");
        let first = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        assert!(first.is_some_and(|f| f.is_ok_and(|f| f.is_data())));
        tx.send(Ok(response(&held))).await.expect("queued");
        assert_eq!(Arc::strong_count(&held[0]), 3, "two responses hold it");
        emptier.empty(Status::unavailable("gave up"));
        assert_eq!(Arc::strong_count(&held[0]), 1, "none does");
        assert_eq!(Arc::strong_count(&held[1]), 1);
        assert!(tx.send(Ok(response(&held))).await.is_err(), "closed");
        let last = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let trailers = last
            .and_then(|f| f.ok())
            .and_then(|f| f.into_trailers().ok())
            .expect("trailers");
        assert_eq!(trailers["grpc-status"], "14");
        assert!(body.is_end_stream());
    }

    /// A body not polled is emptied after the delay.
    #[tokio::test]
    async fn a_body_not_polled_is_emptied_after_the_delay() {
        let held = [mk_entry("ns/a", "1")];
        let (tx, rx) = mpsc::channel(1);
        let body = ResponseBody::new(rx);
        tx.send(Ok(response(&held))).await.expect("queued");
        body.emptier()
            .empty_after(Duration::from_millis(10), Status::unavailable("gave up"));
        tokio::time::timeout(Duration::from_secs(10), async {
            while Arc::strong_count(&held[0]) > 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("emptied");
        assert!(tx.is_closed());
    }
}
