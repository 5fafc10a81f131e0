//! Work on a thread (and runtime) of its own that stops and is joined when dropped: what the
//! harness's long-lived clients (xDS sinks, the ztunnel watch) run on, so a test that panics
//! halfway still closes their streams.

use std::thread::JoinHandle;

use tokio::sync::oneshot;

/// A running thread; told to stop, then joined, on drop.
pub struct Background {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Background {
    /// Runs `body` on a new thread; `body` should return once the receiver it is given resolves
    /// (the owner dropped this).
    pub fn spawn(body: impl FnOnce(oneshot::Receiver<()>) + Send + 'static) -> Background {
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::spawn(move || body(stopped));
        Background {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
