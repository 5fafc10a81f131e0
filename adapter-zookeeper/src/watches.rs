//! What ZooKeeper's watches are known by here, and how a znode is known to be unchanged.
//!
//! A watch is keyed by its kind and path: `c:` a child watch, `d:` a data watch (armed by
//! reading data or by `exists`), `e:` the exists watch on a root that is missing. An event from
//! the server is mapped to the keys it may be the firing of ([`fired`]); the session reads again
//! what those keys watched. A znode's [`Stamp`] is what of its `Stat` changes with every write,
//! so that a check can ask for one `exists` and compare instead of reading again.

use zookeeper_async::{Stat, WatchedEvent, WatchedEventType};

/// A fired watch: which armed watch (`c:`/`d:`/`e:` + path) it was.
pub(crate) struct Hint(pub(crate) String);

/// The watches an event from the server may be the firing of: a child watch (`c:`) fires on
/// a change of children, a data watch (`d:`, armed by reading data or by `exists`) on a change
/// of data or a creation, the exists watch of a missing root (`e:`) on its creation, and all of
/// them on a deletion. Session events (no path) are none.
///
/// Every watch is armed with the request's plain `watch` flag, so that the client library
/// keeps nothing per watch: it hands every event to the client's default watcher, which routes
/// it here. A watcher object per watch (the `_w` requests) would be kept by `zookeeper-async`
/// (5.0.0) until its znode changes, never dropped on a reconnect or a session expiry, although
/// the server forgets the watch with its connection: a znode that never changes would keep one
/// more watcher after every reconnect, as every watch is armed again then.
pub(crate) fn fired(ev: &WatchedEvent) -> Vec<Hint> {
    let Some(path) = ev.path.as_deref() else {
        return Vec::new();
    };
    let keys: &[fn(&str) -> String] = match ev.event_type {
        WatchedEventType::NodeChildrenChanged => &[child_key],
        WatchedEventType::NodeDataChanged => &[data_key],
        WatchedEventType::NodeCreated => &[data_key, exists_key],
        WatchedEventType::NodeDeleted => &[child_key, data_key, exists_key],
        _ => &[],
    };
    keys.iter().map(|key| Hint(key(path))).collect()
}

/// Key of the child watch on `path` in [`crate::reads::Reader`].
pub(crate) fn child_key(path: &str) -> String {
    format!("c:{path}")
}

/// Key of the data watch on `path` in [`crate::reads::Reader`].
pub(crate) fn data_key(path: &str) -> String {
    format!("d:{path}")
}

/// Key of the exists watch on a missing root `path` in [`crate::reads::Reader`].
pub(crate) fn exists_key(path: &str) -> String {
    format!("e:{path}")
}

/// What of a znode's `Stat` changes when its data, children or ACL change: equal stamps mean
/// nothing was written to it in between (a znode deleted and created again has a new `czxid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) czxid: i64,
    mzxid: i64,
    pzxid: i64,
    version: i32,
    cversion: i32,
    aversion: i32,
}

impl Stamp {
    pub(crate) fn of(st: &Stat) -> Self {
        Self {
            czxid: st.czxid,
            mzxid: st.mzxid,
            pzxid: st.pzxid,
            version: st.version,
            cversion: st.cversion,
            aversion: st.aversion,
        }
    }
}

/// What a directory listing does with the directory's stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stamping {
    /// An `exists` first, recorded (a full list).
    Before,
    /// A check has just recorded it.
    Keep,
    /// Forgotten (a fired watch: the next check lists it again, stamped).
    Forget,
}

#[cfg(test)]
mod tests {
    use super::*;
    use zookeeper_async::KeeperState;

    fn keys(event_type: WatchedEventType, path: Option<&str>) -> Vec<String> {
        let ev = WatchedEvent {
            event_type,
            keeper_state: KeeperState::SyncConnected,
            path: path.map(str::to_string),
        };
        fired(&ev).into_iter().map(|Hint(k)| k).collect()
    }

    #[test]
    fn events_map_to_the_watches_they_may_fire() {
        use WatchedEventType as E;
        assert_eq!(keys(E::NodeChildrenChanged, Some("/dubbo")), ["c:/dubbo"]);
        assert_eq!(keys(E::NodeDataChanged, Some("/s/a/1")), ["d:/s/a/1"]);
        assert_eq!(
            keys(E::NodeCreated, Some("/dubbo")),
            ["d:/dubbo", "e:/dubbo"]
        );
        assert_eq!(
            keys(E::NodeDeleted, Some("/s/a")),
            ["c:/s/a", "d:/s/a", "e:/s/a"]
        );
        assert!(
            keys(E::None, None).is_empty(),
            "session events fire nothing"
        );
    }
}
