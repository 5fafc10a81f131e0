//! `zk-writer`: a test tool (an example of this crate, so never shipped with the adapter) that
//! holds one ZooKeeper session open and writes znodes as told on stdin, one command a line,
//! answering `ok` or `err <reason>` on stdout for each:
//!
//! * `create PATH DATA` / `create-e PATH DATA`: persistent / ephemeral node (missing parents are
//!   created persistent; an existing node gets DATA);
//! * `create-private PATH DATA`: ephemeral node readable only by this session's digest
//!   identity (after `auth USER:PASSWORD`);
//! * `auth USER:PASSWORD`: adds digest credentials to the session;
//! * `set PATH DATA`, `delete PATH`;
//! * `expire`: closes the session (its ephemeral nodes vanish) and exits;
//! * `tree PATH`: answers `ok {JSON}` instead, `{child: {grandchild: data}}` of PATH (`{}` when
//!   PATH is missing): what a soak reads back as the registry's own truth.
//!
//! DATA is the rest of the line (may be empty). Usage: `zk-writer HOST:PORT[,..][/chroot]`.

use std::time::Duration;

use std::io::{BufRead, Write};
use zookeeper_async::{Acl, CreateMode, WatchedEvent, ZkError, ZooKeeper, ZooKeeperExt};

/// `{child: {grandchild: data}}` under `path`, data as UTF-8 (lossy); a node deleted between
/// the listing and the read is left out, as it is gone.
async fn tree(zk: &ZooKeeper, path: &str) -> Result<serde_json::Value, String> {
    let e = |e: ZkError| format!("{e:?}");
    let mut out = serde_json::Map::new();
    let children = match zk.get_children(path, false).await {
        Ok(c) => c,
        Err(ZkError::NoNode) => return Ok(serde_json::Value::Object(out)),
        Err(err) => return Err(e(err)),
    };
    for child in children {
        let dir = format!("{}/{child}", path.trim_end_matches('/'));
        let mut leaves = serde_json::Map::new();
        let grandchildren = match zk.get_children(&dir, false).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => continue,
            Err(err) => return Err(e(err)),
        };
        for g in grandchildren {
            match zk.get_data(&format!("{dir}/{g}"), false).await {
                Ok((data, _)) => {
                    leaves.insert(g, String::from_utf8_lossy(&data).into_owned().into());
                }
                Err(ZkError::NoNode) => {}
                Err(err) => return Err(e(err)),
            }
        }
        out.insert(child, serde_json::Value::Object(leaves));
    }
    Ok(serde_json::Value::Object(out))
}

async fn run(zk: &ZooKeeper, line: &str) -> Result<bool, String> {
    let mut parts = line.splitn(3, ' ');
    let cmd = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("");
    let data = parts.next().unwrap_or("").as_bytes().to_vec();
    let e = |e: ZkError| format!("{e:?}");
    match cmd {
        "auth" => {
            zk.add_auth("digest", path.as_bytes().to_vec())
                .await
                .map_err(e)?;
        }
        "create" | "create-e" | "create-private" => {
            if let Some((parent, _)) = path.rsplit_once('/') {
                if !parent.is_empty() {
                    zk.ensure_path(parent).await.map_err(e)?;
                }
            }
            let mode = if cmd == "create" {
                CreateMode::Persistent
            } else {
                CreateMode::Ephemeral
            };
            let acl = if cmd == "create-private" {
                Acl::creator_all().clone()
            } else {
                Acl::open_unsafe().clone()
            };
            match zk.create(path, data.clone(), acl, mode).await {
                Ok(_) => {}
                Err(ZkError::NodeExists) => {
                    zk.set_data(path, data, None).await.map_err(e)?;
                }
                Err(err) => return Err(e(err)),
            }
        }
        "set" => {
            zk.set_data(path, data, None).await.map_err(e)?;
        }
        "delete" => match zk.delete(path, None).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(err) => return Err(e(err)),
        },
        "expire" => {
            zk.close().await.map_err(e)?;
            return Ok(false);
        }
        "" => {}
        other => return Err(format!("unknown command {other:?}")),
    }
    Ok(true)
}

fn main() -> anyhow::Result<()> {
    let servers = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: zk-writer HOST:PORT"))?;
    // The client's IO runs on the runtime's workers; stdin is read on this thread.
    let rt = tokio::runtime::Runtime::new()?;
    let zk = rt
        .block_on(ZooKeeper::connect(
            &servers,
            Duration::from_secs(30),
            |_: WatchedEvent| {},
        ))
        .map_err(|e| anyhow::anyhow!("connect: {e:?}"))?;
    // A request fails at once (ConnectionLoss) until the session is up, which on a loaded
    // machine can take a while after the server answers `ruok`: retry for a bounded time, with
    // a pause, instead of a fixed number of attempts.
    let ok = rt.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::time::timeout(Duration::from_secs(1), zk.exists("/", false))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    anyhow::ensure!(ok, "no ZooKeeper session with {servers}");
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let line = line.trim_end_matches('\r');
        if let Some(path) = line.strip_prefix("tree ") {
            let reply = match rt.block_on(tree(&zk, path)) {
                Ok(t) => format!("ok {t}"),
                Err(e) => format!("err {e}"),
            };
            writeln!(out, "{reply}")?;
            out.flush()?;
            continue;
        }
        let (reply, more) = match rt.block_on(run(&zk, line)) {
            Ok(more) => ("ok".to_string(), more),
            Err(e) => (format!("err {e}"), true),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
        if !more {
            break;
        }
    }
    Ok(())
}
