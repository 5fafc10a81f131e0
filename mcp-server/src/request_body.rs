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
//! they liked. The deadline holds even while the stream's task does not read the body (it waits
//! for a sink that stopped reading to take a response): the body publishes it ([`Receiving`]),
//! and the task waits for it there too.
//!
//! At most [`WAITING_PER_CONNECTION`] large requests of one connection wait for the budget at
//! once; another is refused at once. A waiting stream reads no more of its request, so what its
//! peer has sent of it stays in the connection's receive window: enough waiters would fill that
//! window, and the streams that hold their share, on the same connection, could then receive
//! nothing more of their requests until their deadline refused them.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{watch, AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::Status;

use super::limits::Refused;

/// Requests up to this size need no share of the budget.
pub const FREE: usize = 16 << 10;

/// Large requests of one connection that may wait for the budget at once: each holds up to a
/// stream's receive window of the connection's (`STREAM_WINDOW` of the connection's four),
/// so two leave half the connection's window to the requests that are being received.
pub const WAITING_PER_CONNECTION: usize = 2;

/// gRPC's message prefix: compression flag and 32-bit length.
const PREFIX: usize = 5;

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// Called with a refusal before the stream ends with it (counting and logging it).
pub type OnRefused = Box<dyn Fn(&Refused) + Send + Sync>;

/// The current large message's receive deadline, as its body publishes it: when, and what to
/// say then (its length and `--request-receive-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    at: Instant,
    len: usize,
    timeout: Duration,
}

/// The stream's task's side of the receive deadline: what it waits on while it cannot read the
/// body.
#[derive(Debug)]
pub struct Receiving(watch::Receiver<Option<Due>>);

impl Receiving {
    /// Resolves when a large message's receive deadline passes (pending while there is none):
    /// the refusal the stream ends with.
    pub async fn late(&mut self) -> Refused {
        loop {
            let due = *self.0.borrow_and_update();
            match due {
                Some(d) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(d.at) => {
                            return Refused::RequestReceiveTimeout {
                                len: d.len,
                                timeout: d.timeout,
                            };
                        }
                        changed = self.0.changed() => {
                            if changed.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                    }
                }
                None => {
                    if self.0.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

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
    /// The same, for the stream's task.
    due: watch::Sender<Option<Due>>,
    /// Large requests of this stream's connection waiting for the budget now.
    waiting: Arc<AtomicUsize>,
    /// Whether this stream is one of them.
    counted_waiting: bool,
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
    /// (permits are KiB) and arriving within `timeout` of getting their share; and the
    /// deadline's other side, for the stream's task.
    pub fn new(
        inner: B,
        max: usize,
        budget: Arc<Semaphore>,
        timeout: Duration,
        on_refused: OnRefused,
        waiting: Arc<AtomicUsize>,
    ) -> (Self, Receiving) {
        let (due, receiving) = watch::channel(None);
        let body = Self {
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
            due,
            waiting,
            counted_waiting: false,
            held: None,
            done: false,
        };
        (body, Receiving(receiving))
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
                if self.remaining == 0 && self.permit.is_some() {
                    // The message went by: its share goes back.
                    self.permit = None;
                    self.deadline = None;
                    self.due.send_replace(None);
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

    /// Counts this stream among its connection's waiting ones, unless as many wait already.
    fn start_waiting(&mut self) -> Result<(), Refused> {
        let taken = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < WAITING_PER_CONNECTION).then_some(n + 1)
            });
        match taken {
            Ok(_) => {
                self.counted_waiting = true;
                Ok(())
            }
            Err(waiting) => Err(Refused::LargeRequestsWaiting { waiting }),
        }
    }

    fn stop_waiting(&mut self) {
        if std::mem::take(&mut self.counted_waiting) {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The current message got its share: the receive deadline starts.
    fn hold(&mut self, permit: OwnedSemaphorePermit) {
        self.stop_waiting();
        self.permit = Some(permit);
        let at = Instant::now() + self.timeout;
        self.deadline = Some(Box::pin(tokio::time::sleep_until(at)));
        self.due.send_replace(Some(Due {
            at,
            len: self.len,
            timeout: self.timeout,
        }));
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
        self.stop_waiting();
        self.held = None;
        self.permit = None;
        self.deadline = None;
        self.due.send_replace(None);
        Poll::Ready(Some(Err(refused.status())))
    }
}

impl<B> Drop for MeteredBody<B> {
    fn drop(&mut self) {
        self.stop_waiting();
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
                    if let Err(refused) = this.start_waiting() {
                        return this.refuse(refused);
                    }
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
            let (mut body, _receiving) = MeteredBody::new(
                frames(&bytes, size),
                1 << 20,
                budget.clone(),
                Duration::from_secs(30),
                Box::new(|_| {}),
                Arc::default(),
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
        let (mut body, _receiving) = MeteredBody::new(
            frames(&bytes, 7),
            1000,
            Arc::new(Semaphore::new(100)),
            Duration::from_secs(30),
            Box::new(move |r| seen.lock().expect("lock").push(r.clone())),
            Arc::default(),
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
        let (mut body, _receiving) = MeteredBody::new(
            frames(&bytes, 1 << 20),
            1 << 20,
            budget.clone(),
            Duration::from_secs(30),
            Box::new(|_| {}),
            Arc::default(),
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
        let (mut body, _receiving) = MeteredBody::new(
            Stalling(bytes.chunks(700).map(Bytes::copy_from_slice).collect()),
            1 << 20,
            budget.clone(),
            Duration::from_millis(200),
            Box::new(move |r| seen.lock().expect("lock").push(r.clone())),
            Arc::default(),
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

    #[tokio::test]
    async fn a_connection_has_at_most_two_large_requests_waiting() {
        // The whole budget is held: every large message waits.
        let budget = Arc::new(Semaphore::new(40));
        let held = budget.clone().acquire_many_owned(40).await.expect("permit");
        let refused = Arc::new(Mutex::new(Vec::new()));
        let one_connection = Arc::new(AtomicUsize::new(0));
        let body = |waiting: &Arc<AtomicUsize>| {
            let seen = refused.clone();
            MeteredBody::new(
                frames(&message(30 << 10), 1 << 20),
                1 << 20,
                budget.clone(),
                Duration::from_secs(30),
                Box::new(move |r| seen.lock().expect("lock").push(r.clone())),
                waiting.clone(),
            )
            .0
        };
        let waits = |b: &mut MeteredBody<Frames>| {
            futures_poll_once(std::future::poll_fn(|cx| Pin::new(&mut *b).poll_frame(cx)))
        };
        let (mut first, mut second, mut third) = (
            body(&one_connection),
            body(&one_connection),
            body(&one_connection),
        );
        assert!(waits(&mut first).is_none(), "the first waits");
        assert!(waits(&mut second).is_none(), "the second waits");
        match waits(&mut third) {
            Some(Some(Err(status))) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted);
                assert!(status.message().contains("large requests"), "{status:?}");
            }
            other => panic!("the third was not refused at once: {other:?}"),
        }
        assert_eq!(
            *refused.lock().expect("lock"),
            vec![Refused::LargeRequestsWaiting { waiting: 2 }]
        );
        // Another connection's waits.
        let mut other = body(&Arc::new(AtomicUsize::new(0)));
        assert!(waits(&mut other).is_none(), "another connection's waits");
        // A waiter that goes away makes room; one that gets its share stops counting.
        drop(first);
        assert_eq!(one_connection.load(Ordering::SeqCst), 1);
        let mut fourth = body(&one_connection);
        assert!(waits(&mut fourth).is_none(), "room again");
        drop(held);
        let frame = std::future::poll_fn(|cx| Pin::new(&mut second).poll_frame(cx))
            .await
            .expect("a frame")
            .expect("data");
        assert_eq!(frame.into_data().expect("data").len(), (30 << 10) + PREFIX);
        assert_eq!(one_connection.load(Ordering::SeqCst), 1, "the fourth waits");
        drop(fourth);
        assert_eq!(one_connection.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_receive_deadline_reaches_a_task_that_does_not_read() {
        let budget = Arc::new(Semaphore::new(100));
        let bytes = message(40 << 10)[..PREFIX + 1000].to_vec();
        let (mut body, mut receiving) = MeteredBody::new(
            Stalling(vec![Bytes::copy_from_slice(&bytes)].into()),
            1 << 20,
            budget.clone(),
            Duration::from_millis(200),
            Box::new(|_| {}),
            Arc::default(),
        );
        // Nothing is due before a large message holds a share.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), receiving.late())
                .await
                .is_err(),
            "nothing was due"
        );
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
            .await
            .expect("a frame")
            .expect("data");
        assert_eq!(frame.into_data().expect("data").len(), bytes.len());
        // The task no longer polls the body; the deadline reaches it all the same.
        let started = Instant::now();
        let refused = tokio::time::timeout(Duration::from_secs(10), receiving.late())
            .await
            .expect("the deadline came");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            refused,
            Refused::RequestReceiveTimeout {
                len: 40 << 10,
                timeout: Duration::from_millis(200)
            }
        );
        assert!(
            budget.available_permits() < 100,
            "held until the task ends it"
        );
        drop(body);
        assert_eq!(budget.available_permits(), 100);
    }

    /// Polls `f` once: `None` while it is pending.
    fn futures_poll_once<F: Future>(f: F) -> Option<F::Output> {
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        }
    }
}
