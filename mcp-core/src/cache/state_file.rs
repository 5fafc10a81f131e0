//! `--state-file`: the last served set on disk, so an adapter restarted while its registry is
//! down serves the last good state instead of nothing.
//!
//! The file holds the encoded resources exactly as they were served (length-delimited
//! `istio.mcp.v1alpha1.Resource` messages after a one-line header), so a restored snapshot has
//! the same names, versions, creation times and snapshot version as before the restart: a
//! reconnecting istiod sees no change. It is written to a temporary file, flushed to the disk
//! (`fsync`), renamed over the old one and the directory flushed too, so a crash or a power cut
//! mid-write leaves the previous file whole; by a task of its own, so the writer never waits for
//! the disk.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use prost::Message;
use proto::istio::mcp::v1alpha1::Resource;
use proto::istio::networking::v1alpha3::ServiceEntry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Entry, Snapshot, Summary};

const HEADER: &[u8] = b"mcp-adapter state v1\n";

/// Why the state file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// Reading, writing or renaming failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The content is not a state file of this version, or is cut short.
    #[error("state file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Writes `snapshot` to `path` atomically and durably (the new file or the old one survives a
/// crash, never a mix), streaming the resources (no second copy of the set).
pub fn save(path: &Path, snapshot: &Snapshot) -> Result<(), StateFileError> {
    let io = |source| StateFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut out = BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    out.write_all(HEADER).map_err(io)?;
    let mut len = Vec::with_capacity(10);
    for e in snapshot.iter() {
        len.clear();
        prost::encoding::encode_varint(e.resource.len() as u64, &mut len);
        out.write_all(&len).map_err(io)?;
        out.write_all(&e.resource).map_err(io)?;
    }
    out.flush().map_err(io)?;
    // On the disk before the rename makes it the file: otherwise a power cut can leave the new
    // name pointing at data that was never written.
    out.get_ref().sync_all().map_err(io)?;
    drop(out);
    std::fs::rename(&tmp, path).map_err(io)?;
    // The rename itself lives in the directory.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

/// Keeps `path` holding the latest published set until `shutdown`, then writes the last one.
///
/// Runs beside the writer, not in it: writing a million endpoints takes long enough to delay the
/// next change, and a burst of changes needs only its last set on disk (the watch channel keeps
/// only the newest). A set already written (same snapshot version) is not written again; the set
/// restored from `path` at start is written back once.
pub async fn keep_saved(
    path: PathBuf,
    mut snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    shutdown: CancellationToken,
) {
    let mut saved: Option<String> = None;
    let mut stopping = false;
    loop {
        let latest = snapshots.borrow_and_update().clone();
        if let Some(snapshot) = latest {
            if saved.as_deref() != Some(snapshot.version.as_str()) {
                let version = snapshot.version.clone();
                let at = path.clone();
                match tokio::task::spawn_blocking(move || save(&at, &snapshot)).await {
                    Ok(Ok(())) => saved = Some(version),
                    Ok(Err(e)) => tracing::warn!(error = %e, "Could not save the served set."),
                    Err(e) => tracing::warn!(error = %e, "Saving the served set failed."),
                }
            }
        }
        if stopping {
            return;
        }
        stopping = tokio::select! {
            changed = snapshots.changed() => changed.is_err(),
            _ = shutdown.cancelled() => true,
        };
    }
}

/// Where shard `shard` of `count` (`--shards`) keeps its set: `path` itself for one shard, else
/// `path` with `.shard-<shard>-of-<count>` appended, so a different shard count never restores
/// another split's sets (its services would land on the wrong ports).
pub fn shard_path(path: &Path, shard: usize, count: usize) -> PathBuf {
    if count <= 1 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".shard-{shard}-of-{count}"));
    PathBuf::from(name)
}

/// Reads the snapshot saved at `path`; `None` if there is no file.
pub fn load(path: &Path) -> Result<Option<Snapshot>, StateFileError> {
    let corrupt = |reason: String| StateFileError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let data = match std::fs::read(path) {
        Ok(d) => Bytes::from(d),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateFileError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if !data.starts_with(HEADER) {
        return Err(corrupt("not a state file of this version".into()));
    }
    let mut rest = data.slice(HEADER.len()..);
    let mut entries: Vec<Arc<Entry>> = Vec::new();
    while rest.has_remaining() {
        let len = prost::encoding::decode_varint(&mut rest)
            .map_err(|e| corrupt(format!("entry {}: {e}", entries.len() + 1)))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|l| *l <= rest.len())
            .ok_or_else(|| corrupt(format!("entry {} is cut short", entries.len() + 1)))?;
        let bytes = rest.split_to(len);
        let entry = decode_entry(bytes)
            .map_err(|e| corrupt(format!("entry {}: {e}", entries.len() + 1)))?;
        entries.push(Arc::new(entry));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries.dedup_by(|a, b| a.name == b.name);
    Ok(Some(Snapshot::new(entries)))
}

fn decode_entry(bytes: Bytes) -> Result<Entry, String> {
    let r = Resource::decode(bytes.clone()).map_err(|e| e.to_string())?;
    let md = r.metadata.ok_or("no metadata")?;
    let body = r.body.ok_or("no body")?;
    let se = ServiceEntry::decode(body.value.as_slice()).map_err(|e| e.to_string())?;
    Ok(Entry {
        name: md.name.into(),
        version: md.version.into(),
        resource: bytes,
        summary: Summary {
            hosts: se.hosts,
            ports: se.ports.len(),
            endpoints: se.endpoints.len(),
            create_time: md.create_time.map_or(0, |t| t.seconds),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::encode;
    use crate::index::Index;
    use crate::metrics::Metrics;
    use crate::registry::RegistryEvent;
    use crate::testing::mk_service;

    fn snapshot() -> Arc<Snapshot> {
        let mut idx = Index::new(
            crate::translate::test_config(
                crate::translate::OnEmpty::Keep,
                crate::vip::VipCidr::Off,
            ),
            Metrics::new("test").expect("metrics"),
        );
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("b", 2),
            mk_service("a", 1),
        ]));
        idx.flush().expect("snapshot")
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("mcp-state-{}-{name}", std::process::id()))
    }

    #[test]
    fn round_trip_keeps_names_versions_and_bytes() {
        let _ = encode; // the entries come from the one encoder
        let s = snapshot();
        let path = temp("roundtrip");
        save(&path, &s).expect("saved");
        let back = load(&path).expect("read").expect("present");
        assert_eq!(back.version, s.version);
        assert!(back.iter().eq(s.iter()));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn missing_is_none_and_garbage_is_an_error_naming_the_file() {
        let path = temp("missing");
        assert!(load(&path).expect("no error").is_none());
        std::fs::write(&path, b"hello").expect("write");
        let err = load(&path).expect_err("not a state file").to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        let mut cut = HEADER.to_vec();
        cut.extend_from_slice(&[200, 1, 1, 2]);
        std::fs::write(&path, cut).expect("write");
        let err = load(&path).expect_err("cut short").to_string();
        assert!(err.contains("cut short"), "{err}");
        let _ = std::fs::remove_file(&path);
    }

    /// A crash mid-write leaves `<path>.tmp` behind: the file itself is still the last whole
    /// one, and the next save overwrites the leftover and renames it over the file.
    #[test]
    fn a_temporary_file_left_by_a_crash_is_never_read_and_is_replaced() {
        let path = temp("crash");
        let s = snapshot();
        save(&path, &s).expect("saved");
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, b"mcp-adapter state v1\n\x05half").expect("a torn write");
        let back = load(&path).expect("read").expect("present");
        assert_eq!(back.version, s.version, "the last whole file");
        save(&path, &s).expect("saved over the leftover");
        assert!(!tmp.exists(), "renamed over the file");
        assert_eq!(
            load(&path).expect("read").expect("present").version,
            s.version
        );
        let _ = std::fs::remove_file(&path);
    }

    /// The saver writes what is published without the writer waiting, and on shutdown writes the
    /// newest set even if it arrived in the same instant.
    #[tokio::test]
    async fn keeps_the_newest_published_set_and_writes_the_last_on_shutdown() {
        let path = temp("keep");
        let _ = std::fs::remove_file(&path);
        let first = snapshot();
        let (tx, rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let saver = tokio::spawn(keep_saved(path.clone(), rx, stop.clone()));
        tx.send_replace(Some(Arc::clone(&first)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while load(&path).ok().flatten().map(|s| s.version) != Some(first.version.clone()) {
            assert!(
                std::time::Instant::now() < deadline,
                "first set never saved"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut idx = Index::new(
            crate::translate::test_config(
                crate::translate::OnEmpty::Keep,
                crate::vip::VipCidr::Off,
            ),
            Metrics::new("test").expect("metrics"),
        );
        idx.apply(RegistryEvent::Reset(vec![mk_service("c", 3)]));
        let last = idx.flush().expect("snapshot");
        tx.send_replace(Some(Arc::clone(&last)));
        stop.cancel();
        saver.await.expect("saver ends on shutdown");
        let back = load(&path).expect("read").expect("present");
        assert_eq!(back.version, last.version, "the newest set is on disk");
        assert!(back.iter().eq(last.iter()));
        let _ = std::fs::remove_file(&path);
    }
}
