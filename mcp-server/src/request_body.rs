//! The request half of a stream, metered before tonic buffers it.
//!
//! tonic's decoder keeps a message's bytes until the whole message is in, and reserves room for
//! its declared length as soon as the 5-byte gRPC prefix arrives. So a peer declaring large
//! requests on many streams, and sending them slowly, holds `streams × --max-request-size` of
//! the adapter's memory. This body reads the prefixes as the bytes go by: a message over
//! `--max-request-size` ends the stream at once with a status naming the flag, and a message
//! over [`FREE`] (no istiod or Pilot request is: they are a few KiB; delta sinks that reconnect
//! holding many resources send larger ones) takes its length from a budget shared by every
//! stream of the process until its last byte has gone by; while the budget is used up it waits,
//! and HTTP/2 flow control holds the peer back. A message holding a share must arrive whole
//! within `--request-receive-timeout` of getting it, or the stream ends with a status naming
//! the flag: four peers announcing the largest request and then sending nothing would
//! otherwise hold the whole budget, and every later large request would wait, for as long as
//! they liked.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::Status;

use super::limits::Refused;

/// Requests up to this size need no share of the budget.
pub const FREE: usize = 16 << 10;

/// gRPC's message prefix: compression flag and 32-bit length.
const PREFIX: usize = 5;

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// Called with a refusal before the stream ends with it (counting and logging it).
pub type OnRefused = Box<dyn Fn(&Refused) + Send + Sync>;

/// A request body whose gRPC messages are checked and budgeted (see the module docs).
pub struct MeteredBody<B> {
    inner: B,
    max: usize,
    budget: Arc<Semaphore>,
    on_refused: OnRefused,
    /// Prefix bytes of the next message read so far.
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// Body bytes of the current message still to go by.
    remaining: usize,
    /// The current message's share of the budget.
    permit: Option<OwnedSemaphorePermit>,
    /// The current message's declared length.
    len: usize,
    /// `--request-receive-timeout`.
    timeout: Duration,
    /// While a message holds a share: when it must have arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    /// A data frame held back until the budget has room for the message it starts: the frame,
    /// where the scan stopped, and the wait.
    held: Option<(Bytes, usize, Acquire)>,
    done: bool,
}

impl<B> std::fmt::Debug for MeteredBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredBody")
            .field("max", &self.max)
            .field("remaining", &self.remaining)
            .field("waiting", &self.held.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> MeteredBody<B> {
    /// Meters `inner`: messages up to `max` bytes, larger ones than [`FREE`] sharing `budget`
    /// (permits are KiB) and arriving within `timeout` of getting their share.
    pub fn new(
        inner: B,
        max: usize,
        budget: Arc<Semaphore>,
        timeout: Duration,
        on_refused: OnRefused,
    ) -> Self {
        Self {
            inner,
            max,
            budget,
            on_refused,
            prefix: [0; PREFIX],
            prefix_len: 0,
            remaining: 0,
            permit: None,
            len: 0,
            timeout,
            deadline: None,
            held: None,
            done: false,
        }
    }

    /// Scans `data` from `at`; `Ok(None)` when the whole frame may go on, `Ok(Some(at))` when
    /// the message whose prefix ends at `at` must first get its share of the budget (it is
    /// then asked for in `self.held`).
    fn scan(&mut self, data: &Bytes, mut at: usize) -> Result<Option<usize>, Refused> {
        while at < data.len() {
            if self.remaining > 0 {
                let take = self.remaining.min(data.len() - at);
                self.remaining -= take;
                at += take;
                if self.remaining == 0 {
                    // The message went by: its share goes back.
                    self.permit = None;
                    self.deadline = None;
                }
                continue;
            }
            let take = (PREFIX - self.prefix_len).min(data.len() - at);
            self.prefix[self.prefix_len..self.prefix_len + take]
                .copy_from_slice(&data[at..at + take]);
            self.prefix_len += take;
            at += take;
            if self.prefix_len < PREFIX {
                break;
            }
            self.prefix_len = 0;
            let len = u32::from_be_bytes([
                self.prefix[1],
                self.prefix[2],
                self.prefix[3],
                self.prefix[4],
            ]) as usize;
            if len > self.max {
                return Err(Refused::RequestSize {
                    len,
                    limit: self.max,
                });
            }
            self.remaining = len;
            self.len = len;
            if len > FREE {
                let kib = u32::try_from(len.div_ceil(1024)).unwrap_or(u32::MAX);
                match Arc::clone(&self.budget).try_acquire_many_owned(kib) {
                    Ok(p) => self.hold(p),
                    Err(_) => return Ok(Some(at)),
                }
            }
        }
        Ok(None)
    }

    /// The current message got its share: the receive deadline starts.
    fn hold(&mut self, permit: OwnedSemaphorePermit) {
        self.permit = Some(permit);
        self.deadline = Some(Box::pin(tokio::time::sleep(self.timeout)));
    }

    /// Whether the current message's receive deadline passed (registering the wake-up if not).
    fn late(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
    }

    fn refuse(&mut self, refused: Refused) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        (self.on_refused)(&refused);
        self.done = true;
        // The share goes back now, not when the stream's task gets to drop the body.
        self.permit = None;
        self.deadline = None;
        Poll::Ready(Some(Err(refused.status())))
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            let (data, at) = match this.held.take() {
                Some((data, at, mut wait)) => match wait.as_mut().poll(cx) {
                    Poll::Pending => {
                        this.held = Some((data, at, wait));
                        return Poll::Pending;
                    }
                    Poll::Ready(Ok(permit)) => {
                        this.hold(permit);
                        (data, at)
                    }
                    Poll::Ready(Err(_)) => {
                        this.done = true;
                        return Poll::Ready(Some(Err(Status::unavailable("shutting down"))));
                    }
                },
                None => match Pin::new(&mut this.inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => (data, 0),
                        Err(other) => return Poll::Ready(Some(Ok(other))),
                    },
                    Poll::Pending if this.late(cx) => {
                        let (len, timeout) = (this.len, this.timeout);
                        return this.refuse(Refused::RequestReceiveTimeout { len, timeout });
                    }
                    other => return other,
                },
            };
            match this.scan(&data, at) {
                Ok(None) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Some(at)) => {
                    let kib = u32::try_from(this.remaining.div_ceil(1024)).unwrap_or(u32::MAX);
                    let wait = Box::pin(Arc::clone(&this.budget).acquire_many_owned(kib));
                    this.held = Some((data, at, wait));
                }
                Err(refused) => return this.refuse(refused),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.held.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// A body that yields the given frames.
    struct Frames(std::collections::VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    /// A body that yields the given frames, then nothing, ever (a peer that stalled).
    struct Stalling(std::collections::VecDeque<Bytes>);

    impl Body for Stalling {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            match self.0.pop_front() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    /// Splits `bytes` into frames of `size`.
    fn frames(bytes: &[u8], size: usize) -> Frames {
        Frames(bytes.chunks(size).map(Bytes::copy_from_slice).collect())
    }

    async fn collect(body: &mut MeteredBody<Frames>) -> Result<Vec<u8>, Status> {
        let mut out = Vec::new();
        while let Some(f) = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            out.extend_from_slice(&f?.into_data().unwrap_or_default());
        }
        Ok(out)
    }

    #[tokio::test]
    async fn messages_pass_unchanged_and_their_share_comes_back() {
        let budget = Arc::new(Semaphore::new(100));
        let mut bytes = message(10);
        bytes.extend(message(40 << 10));
        bytes.extend(message(0));
        bytes.extend(message(30 << 10));
        for size in [1, 3, 5, 4096, 1 << 20] {
            let mut body = MeteredBody::new(
                frames(&bytes, size),
                1 << 20,
                budget.clone(),
                Duration::from_secs(30),
                Box::new(|_| {}),
            );
            assert_eq!(
                collect(&mut body).await.expect("body"),
                bytes,
                "frames of {size}"
            );
            assert_eq!(budget.available_permits(), 100, "frames of {size}");
        }
    }

    #[tokio::test]
    async fn a_message_over_the_limit_is_refused_from_its_prefix() {
        let refused = Arc::new(Mutex::new(Vec::new()));
        let seen = refused.clone();
        let mut bytes = message(8);
        bytes.extend(&message(2000)[..PREFIX + 10]);
        let mut body = MeteredBody::new(
            frames(&bytes, 7),
            1000,
            Arc::new(Semaphore::new(100)),
            Duration::from_secs(30),
            Box::new(move |r| seen.lock().expect("lock").push(r.clone())),
        );
        let status = collect(&mut body).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("--max-request-size"),
            "{status:?}"
        );
        assert_eq!(
            *refused.lock().expect("lock"),
            vec![Refused::RequestSize {
                len: 2000,
                limit: 1000
            }]
        );
    }

    #[tokio::test]
    async fn a_large_message_waits_for_room_in_the_budget() {
        // 40 KiB of budget: one 30 KiB message at a time.
        let budget = Arc::new(Semaphore::new(40));
        let held = budget.clone().acquire_many_owned(30).await.expect("permit");
        let bytes = message(30 << 10);
        let mut body = MeteredBody::new(
            frames(&bytes, 1 << 20),
            1 << 20,
            budget.clone(),
            Duration::from_secs(30),
            Box::new(|_| {}),
        );
        let polls = Arc::new(AtomicUsize::new(0));
        let p = polls.clone();
        let first = std::future::poll_fn(|cx| {
            p.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut body).poll_frame(cx)
        });
        tokio::pin!(first);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(100), &mut first)
                .await
                .is_err(),
            "nothing passes while the budget is used"
        );
        drop(held);
        let frame = first.await.expect("a frame").expect("data");
        assert_eq!(frame.into_data().expect("data").len(), bytes.len());
        assert_eq!(budget.available_permits(), 40);
    }

    #[tokio::test]
    async fn a_large_message_that_stalls_is_refused_and_gives_its_share_back() {
        let budget = Arc::new(Semaphore::new(100));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let seen = refused.clone();
        // A small message passes, then a 40 KiB one announces itself and stalls half-way.
        let mut bytes = message(10);
        bytes.extend(&message(40 << 10)[..PREFIX + 1000]);
        let mut body = MeteredBody::new(
            Stalling(bytes.chunks(700).map(Bytes::copy_from_slice).collect()),
            1 << 20,
            budget.clone(),
            Duration::from_millis(200),
            Box::new(move |r| seen.lock().expect("lock").push(r.clone())),
        );
        let mut passed = 0;
        let status = loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                Some(Ok(f)) => passed += f.into_data().map(|d| d.len()).unwrap_or_default(),
                Some(Err(s)) => break s,
                None => panic!("the body ended"),
            }
            if passed > 0 && passed < bytes.len() {
                // The share is held while the message arrives.
                assert!(budget.available_permits() <= 100);
            }
        };
        assert_eq!(passed, bytes.len(), "everything sent went on");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("--request-receive-timeout"),
            "{status:?}"
        );
        assert_eq!(
            *refused.lock().expect("lock"),
            vec![Refused::RequestReceiveTimeout {
                len: 40 << 10,
                timeout: Duration::from_millis(200)
            }]
        );
        assert_eq!(budget.available_permits(), 100, "the share came back");
        assert!(body.is_end_stream());
    }
}
