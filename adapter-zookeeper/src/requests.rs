//! One ZooKeeper request of a watch: sent with the request timeout, counted, and its outcome
//! classified. A failure either ends the watch (the connection or session is gone, the request
//! timed out, the credentials were refused) or is a problem of the one znode it read; a
//! connection lost under it (a leader election, a server restart) is noted, so that it ends the
//! pass and not the watch ([`Requests::take_interrupted`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcp_core::RegistryError;
use tokio::time::timeout;
use zookeeper_async::{ZkError, ZooKeeper};

/// Why a read failed.
pub(crate) enum OpError {
    /// The connection or session is gone: end the watch.
    Fatal(RegistryError),
    /// This znode cannot be read (reported as a problem).
    Skip(String),
}

/// Requests sent, by kind (never reset: a pass reports the difference).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// `exists` (stat only).
    pub(crate) exists: u64,
    /// Children listed.
    pub(crate) lists: u64,
    /// Data read.
    pub(crate) data: u64,
    /// Bytes of names listed and data read (an `exists` answers a fixed-size stat).
    pub(crate) bytes: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            exists: self.exists - o.exists,
            lists: self.lists - o.lists,
            data: self.data - o.data,
            bytes: self.bytes - o.bytes,
        }
    }
}

/// Which counter a request adds to.
#[derive(Clone, Copy)]
pub(crate) enum Req {
    Exists,
    List,
    Data,
    Auth,
}

/// The requests of one watch on its session.
pub(crate) struct Requests {
    /// The session.
    pub(crate) zk: Arc<ZooKeeper>,
    request_timeout: Duration,
    /// A request failed because the connection was lost (the session may well be alive).
    interrupted: AtomicBool,
    exists: AtomicU64,
    lists: AtomicU64,
    data: AtomicU64,
    bytes: AtomicU64,
}

impl Requests {
    /// Requests on session `zk`, none sent yet.
    pub(crate) fn new(zk: Arc<ZooKeeper>, request_timeout: Duration) -> Self {
        Self {
            zk,
            request_timeout,
            interrupted: AtomicBool::new(false),
            exists: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            data: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Requests sent so far.
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            exists: self.exists.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            data: self.data.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    /// Counts bytes of names listed or data read.
    pub(crate) fn add_bytes(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Whether a request failed because the connection was lost since the last call.
    pub(crate) fn take_interrupted(&self) -> bool {
        self.interrupted.swap(false, Ordering::Relaxed)
    }

    /// Runs a ZooKeeper request with the request timeout and classifies its failure.
    pub(crate) async fn op<T>(
        &self,
        req: Req,
        what: &str,
        fut: impl Future<Output = Result<T, ZkError>>,
    ) -> Result<Option<T>, OpError> {
        let counter = match req {
            Req::Exists => Some(&self.exists),
            Req::List => Some(&self.lists),
            Req::Data => Some(&self.data),
            Req::Auth => None,
        };
        if let Some(c) = counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.classify(what, timeout(self.request_timeout, fut).await)
    }

    /// What a request's outcome means for the watch.
    fn classify<T>(
        &self,
        what: &str,
        r: Result<Result<T, ZkError>, tokio::time::error::Elapsed>,
    ) -> Result<Option<T>, OpError> {
        let fatal = OpError::Fatal;
        match r {
            Err(_) => Err(fatal(RegistryError::Unavailable(format!(
                "ZooKeeper request for {what} timed out after {:?}",
                self.request_timeout
            )))),
            Ok(Ok(v)) => Ok(Some(v)),
            Ok(Err(ZkError::NoNode)) => Ok(None),
            Ok(Err(ZkError::NoAuth)) => Err(OpError::Skip(format!(
                "zookeeper {what}: not readable with the configured credentials (NoAuth)"
            ))),
            Ok(Err(ZkError::AuthFailed)) => Err(fatal(RegistryError::Unauthorized(format!(
                "ZooKeeper refused the digest credentials ({what})"
            )))),
            // The client reconnects by itself within the session (a leader election, a server
            // restart): the pass ends here, the session re-arms once connected again.
            Ok(Err(e @ (ZkError::ConnectionLoss | ZkError::SessionMoved))) => {
                self.interrupted.store(true, Ordering::Relaxed);
                Err(fatal(RegistryError::Unavailable(format!(
                    "ZooKeeper request for {what} failed: {e:?}"
                ))))
            }
            Ok(Err(
                e @ (ZkError::SessionExpired
                | ZkError::OperationTimeout
                | ZkError::MarshallingError),
            )) => Err(fatal(RegistryError::Unavailable(format!(
                "ZooKeeper request for {what} failed: {e:?}"
            )))),
            Ok(Err(e)) => Err(OpError::Skip(format!(
                "zookeeper {what}: cannot read ({e:?})"
            ))),
        }
    }

    /// Adds the digest credentials to the session (the client does not re-send them after a
    /// reconnect either).
    pub(crate) async fn add_auth(&self, digest: &str) -> Result<(), RegistryError> {
        let zk = Arc::clone(&self.zk);
        match self
            .op(
                Req::Auth,
                "auth",
                zk.add_auth("digest", digest.as_bytes().to_vec()),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(OpError::Fatal(e)) => Err(e),
            Err(OpError::Skip(p)) => Err(RegistryError::Unauthorized(p)),
        }
    }
}
