//! Where the sessions' stream readers leave what the server sent, for the watch to take.
//!
//! A reader must never wait on the watch: while it waits it cannot answer the server's
//! `ClientDetectionRequest`, and Nacos closes a connection that does not answer. So a reader
//! only writes here, and the watch takes everything at once when it is free (between catalog
//! reads and subscriptions, which can take a while for thousands of services). Each push carries
//! a service's whole instance list, so only the latest one per service is kept: the inbox holds
//! at most one list per subscribed service however fast the server pushes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::dto::{ServiceInfo, UnreadablePush};

/// `(namespace, group, name)`.
pub type PushKey = (String, String, String);

/// What the readers left since the watch last looked.
#[derive(Debug, Default)]
pub struct Taken {
    /// The latest push per service.
    pub pushes: BTreeMap<PushKey, ServiceInfo>,
    /// Pushes that could not be read (acknowledged all the same), by namespace.
    pub unreadable: Vec<(String, UnreadablePush)>,
    /// A connection that ended: namespace and why. The first one is enough to end the watch.
    pub lost: Option<(String, String)>,
    /// How many pushes arrived (several for one service count each).
    pub received: u64,
}

/// Shared by the watch and every reader of one watch.
#[derive(Debug, Default)]
pub struct Inbox {
    pending: Mutex<Taken>,
    notify: Notify,
}

impl Inbox {
    /// A push of `info` on namespace `ns`'s connection.
    pub fn push(&self, ns: &str, info: ServiceInfo) {
        let (group, name) = info.group_and_name();
        self.with(|t| {
            t.received += 1;
            t.pushes.insert((ns.to_string(), group, name), info);
        });
    }

    /// A push on namespace `ns`'s connection that could not be read.
    pub fn unreadable(&self, ns: &str, push: UnreadablePush) {
        self.with(|t| {
            t.received += 1;
            t.unreadable.push((ns.to_string(), push));
        });
    }

    /// Namespace `ns`'s connection ended.
    pub fn lost(&self, ns: &str, reason: String) {
        self.with(|t| {
            t.lost.get_or_insert_with(|| (ns.to_string(), reason));
        });
    }

    /// Waits until something arrived since the last [`Inbox::take`] (at once when it did).
    pub async fn wait(&self) {
        self.notify.notified().await;
    }

    /// Everything left so far.
    pub fn take(&self) -> Taken {
        std::mem::take(&mut *self.lock())
    }

    fn with(&self, f: impl FnOnce(&mut Taken)) {
        f(&mut self.lock());
        // One stored permit at most: a burst of pushes wakes the watch once.
        self.notify.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Taken> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, hosts: usize) -> ServiceInfo {
        let mut i = ServiceInfo::empty("G", name);
        i.hosts = (0..hosts)
            .map(|n| {
                Ok(crate::dto::Instance {
                    ip: format!("10.0.0.{n}"),
                    ..Default::default()
                })
            })
            .collect();
        i
    }

    #[tokio::test]
    async fn keeps_the_latest_push_per_service_and_wakes_once() {
        let inbox = Inbox::default();
        for n in 0..1000 {
            inbox.push("public", info("orders", n % 7));
        }
        inbox.push("dev", info("orders", 1));
        inbox.wait().await;
        let t = inbox.take();
        assert_eq!(t.received, 1001);
        assert_eq!(t.pushes.len(), 2, "one per namespace and service");
        let key = ("public".to_string(), "G".to_string(), "orders".to_string());
        assert_eq!(t.pushes[&key].hosts.len(), 999 % 7, "the latest");
        // Taken: nothing left, and no stale wake-up beyond the one stored permit.
        assert!(inbox.take().pushes.is_empty());
        inbox.lost("dev", "gone".into());
        inbox.lost("public", "later".into());
        inbox.wait().await;
        assert_eq!(inbox.take().lost, Some(("dev".into(), "gone".into())));
    }
}
