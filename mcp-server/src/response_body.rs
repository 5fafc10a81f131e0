//! The HTTP/2 response body of one stream: the responses its task hands over, written as
//! [`Chunks`], then the gRPC status in trailers.
//!
//! The transport asks for the next piece only when the stream has flow-control room, so a sink
//! that stops reading holds this body at its current piece: what it costs is that piece, the
//! response it belongs to (which shares the cache's bytes) and the channel's one slot.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tonic::Status;

use super::frames::{Chunks, Encoded};

/// What a stream's task sends to its body.
pub type Sent = Result<Encoded, Status>;

/// Body of one streaming response.
#[derive(Debug)]
pub struct ResponseBody {
    rx: mpsc::Receiver<Sent>,
    current: Option<Chunks>,
    /// Status to end with (set by an error from the task).
    status: Option<Status>,
    ended: bool,
}

impl ResponseBody {
    /// A body fed by `rx`; it ends (status OK) when every sender is gone.
    pub fn new(rx: mpsc::Receiver<Sent>) -> Self {
        Self {
            rx,
            current: None,
            status: None,
            ended: false,
        }
    }

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
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
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
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
