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
//!
//! Between the header and the resources, one JSON line holds what is not in the served set: the
//! virtual IP quarantine (`vip::SavedVip`), so a restart during one does not hand the address to
//! another service. A file of version 1 (no such line) still loads, with no quarantine; a field
//! missing from the line is empty (serde `default`), one unknown to this version is ignored.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::{Buf, Bytes};
use prost::Message;
use proto::istio::mcp::v1alpha1::Resource;
use proto::istio::networking::v1alpha3::ServiceEntry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Entry, Snapshot, Summary};
use crate::vip::{QuarantinedVip, SavedVip};

/// The header of files with the JSON line ([`Meta`]); what this version writes.
const HEADER: &[u8] = b"mcp-adapter state v2\n";
/// The header of files written before the JSON line (#43 item 9): resources only.
const HEADER_V1: &[u8] = b"mcp-adapter state v1\n";

/// The JSON line after [`HEADER`].
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    /// The virtual IPs in quarantine when the file was written.
    #[serde(default)]
    vip_quarantine: Vec<SavedVip>,
}

/// What a state file holds.
#[derive(Debug)]
pub struct Saved {
    /// The served set.
    pub snapshot: Snapshot,
    /// The virtual IPs in quarantine when it was written (none in a version 1 file).
    pub vip_quarantine: Vec<SavedVip>,
}

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

/// Writes `snapshot` and the virtual IP quarantine to `path` atomically and durably (the new
/// file or the old one survives a crash, never a mix), streaming the resources (no second copy
/// of the set).
pub fn save(
    path: &Path,
    snapshot: &Snapshot,
    vip_quarantine: &[SavedVip],
) -> Result<(), StateFileError> {
    let io = |source| StateFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut out = BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    out.write_all(HEADER).map_err(io)?;
    let meta = Meta {
        vip_quarantine: vip_quarantine.to_vec(),
    };
    // Compact JSON escapes every newline in a string: the line ends at the first one.
    serde_json::to_writer(&mut out, &meta).map_err(|e| io(e.into()))?;
    out.write_all(b"\n").map_err(io)?;
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

/// Keeps `path` holding the latest published set and virtual IP quarantine until `shutdown`,
/// then writes the last ones.
///
/// Runs beside the writer, not in it: writing a million endpoints takes long enough to delay the
/// next change, and a burst of changes needs only its last set on disk (the watch channels keep
/// only the newest). A set already written (same snapshot version, same quarantine) is not
/// written again; the set restored from `path` at start is written back once.
pub async fn keep_saved(
    path: PathBuf,
    mut snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    mut vips: watch::Receiver<Arc<[QuarantinedVip]>>,
    shutdown: CancellationToken,
) {
    let mut saved: Option<(String, Arc<[QuarantinedVip]>)> = None;
    let mut stopping = false;
    loop {
        let latest = snapshots.borrow_and_update().clone();
        let quarantine = Arc::clone(&vips.borrow_and_update());
        if let Some(snapshot) = latest {
            let written = saved
                .as_ref()
                .is_some_and(|(v, q)| *v == snapshot.version && **q == *quarantine);
            if !written {
                let version = snapshot.version.clone();
                let at = path.clone();
                let q = Arc::clone(&quarantine);
                let write = move || {
                    let (now, wall) = (Instant::now(), SystemTime::now());
                    let q: Vec<SavedVip> = q.iter().map(|v| SavedVip::of(v, now, wall)).collect();
                    save(&at, &snapshot, &q)
                };
                match tokio::task::spawn_blocking(write).await {
                    Ok(Ok(())) => saved = Some((version, quarantine)),
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
            changed = vips.changed() => changed.is_err(),
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

/// Reads what was saved at `path`; `None` if there is no file.
pub fn load(path: &Path) -> Result<Option<Saved>, StateFileError> {
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
    let (meta, mut rest) = if data.starts_with(HEADER) {
        let body = data.slice(HEADER.len()..);
        let line = body
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| corrupt("the line after the header is cut short".into()))?;
        let meta: Meta = serde_json::from_slice(&body[..line])
            .map_err(|e| corrupt(format!("the line after the header: {e}")))?;
        (meta, body.slice(line + 1..))
    } else if data.starts_with(HEADER_V1) {
        (Meta::default(), data.slice(HEADER_V1.len()..))
    } else {
        return Err(corrupt("not a state file of a known version".into()));
    };
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
    Ok(Some(Saved {
        snapshot: Snapshot::new(entries),
        vip_quarantine: meta.vip_quarantine,
    }))
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
    use crate::model::{CreationOrder, ServiceKey};
    use crate::registry::RegistryEvent;
    use crate::testing::mk_service;
    use crate::vip::{VipCidr, Vips};
    use std::collections::BTreeSet;
    use std::net::Ipv4Addr;
    use std::time::Duration;

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
        save(&path, &s, &[]).expect("saved");
        let back = load(&path).expect("read").expect("present").snapshot;
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
        cut.extend_from_slice(b"{}\n");
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
        save(&path, &s, &[]).expect("saved");
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, b"mcp-adapter state v1\n\x05half").expect("a torn write");
        let back = load(&path).expect("read").expect("present").snapshot;
        assert_eq!(back.version, s.version, "the last whole file");
        save(&path, &s, &[]).expect("saved over the leftover");
        assert!(!tmp.exists(), "renamed over the file");
        assert_eq!(
            load(&path)
                .expect("read")
                .expect("present")
                .snapshot
                .version,
            s.version
        );
        let _ = std::fs::remove_file(&path);
    }

    /// Waits until what is saved at `path` is `done`.
    async fn wait_saved(path: &Path, what: &str, done: impl Fn(&Saved) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !load(path).ok().flatten().is_some_and(|s| done(&s)) {
            assert!(Instant::now() < deadline, "{what} never saved");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The saver writes what is published without the writer waiting, and on shutdown writes the
    /// newest set even if it arrived in the same instant; a quarantine that changed alone is
    /// written too.
    #[tokio::test]
    async fn keeps_the_newest_published_set_and_writes_the_last_on_shutdown() {
        let path = temp("keep");
        let _ = std::fs::remove_file(&path);
        let first = snapshot();
        let (tx, rx) = watch::channel(None);
        let (vips_tx, vips_rx) = watch::channel(Arc::<[QuarantinedVip]>::from([]));
        let stop = CancellationToken::new();
        let saver = tokio::spawn(keep_saved(path.clone(), rx, vips_rx, stop.clone()));
        tx.send_replace(Some(Arc::clone(&first)));
        wait_saved(&path, "first set", |s| s.snapshot.version == first.version).await;
        let q = QuarantinedVip {
            address: Ipv4Addr::new(242, 3, 0, 9),
            released_by: ServiceKey::new("gone"),
            until: Instant::now() + Duration::from_secs(60),
        };
        vips_tx.send_replace(Arc::from([q]));
        wait_saved(&path, "the quarantine", |s| {
            s.vip_quarantine
                .iter()
                .map(SavedVip::released_by)
                .eq([ServiceKey::new("gone")])
        })
        .await;
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
        assert_eq!(back.vip_quarantine.len(), 1, "still in quarantine");
        let back = back.snapshot;
        assert_eq!(back.version, last.version, "the newest set is on disk");
        assert!(back.iter().eq(last.iter()));
        let _ = std::fs::remove_file(&path);
    }

    /// Two keys with one home address in `cidr`.
    fn rivals(cidr: VipCidr) -> (ServiceKey, ServiceKey) {
        let mut homes = std::collections::HashMap::new();
        (0..)
            .find_map(|i| {
                let k = ServiceKey::new(format!("s{i}"));
                homes
                    .insert(cidr.home_address(&k), k.clone())
                    .map(|first| (first, k))
            })
            .expect("a collision")
    }

    /// #43 item 9: `a` lets go of its address and the adapter restarts 10 s into the
    /// quarantine, reading it back from the file: `b`, new and placed at that address, is kept
    /// from it until the quarantine (60 s from the release) ends, while `a` may take it back.
    /// Before, the file held no quarantine and `b` got the address at once.
    #[test]
    fn the_vip_quarantine_survives_a_restart_through_the_file() {
        let cidr = VipCidr::range(242, 3, 0, 0, 27);
        let q = Duration::from_secs(60);
        let (a, b) = rivals(cidr);
        let dated = |o: u64| Some(Some(CreationOrder::new(o)));
        let t0 = Instant::now();
        let mut before = Vips::new(cidr);
        before.set_quarantine(q);
        before.set(&a, dated(1));
        before.settle(t0, &mut BTreeSet::new());
        let home = before.get(&a).expect("a has an address");
        assert_eq!(Some(home), cidr.home_address(&b), "b would be placed there");
        before.set(&a, None);
        before.settle(t0, &mut BTreeSet::new());
        // Saved as the saver saves it: the end read on the wall clock.
        let wall = SystemTime::now();
        let saved: Vec<SavedVip> = before
            .quarantined(t0)
            .iter()
            .map(|v| SavedVip::of(v, t0, wall))
            .collect();
        let path = temp("vip-quarantine");
        save(&path, &snapshot(), &saved).expect("saved");
        let back = load(&path).expect("read").expect("present");
        let _ = std::fs::remove_file(&path);

        let restarted = |then: Instant| {
            let mut v = Vips::new(cidr);
            v.set_quarantine(q);
            let kept =
                v.restore_quarantine(&back.vip_quarantine, wall + Duration::from_secs(10), then);
            (v, kept)
        };
        let t1 = Instant::now();
        let (mut after, kept) = restarted(t1);
        after.set(&b, dated(2));
        let mut changed = BTreeSet::new();
        after.settle(t1, &mut changed);
        let got = after.get(&b);
        assert!(got.is_some(), "b waits in a spare address");
        assert_ne!(
            got,
            Some(home),
            "b got the address a let go of 10 s before the restart"
        );
        assert_eq!(kept, 1);
        assert_eq!(after.next_deadline(), Some(t1 + Duration::from_secs(50)));
        let shown = after.quarantined(t1);
        assert_eq!(
            shown
                .iter()
                .map(|v| (v.address, &v.released_by))
                .collect::<Vec<_>>(),
            [(home, &a)]
        );
        after.settle(t1 + Duration::from_secs(49), &mut changed);
        assert_ne!(after.get(&b), Some(home), "still in quarantine");
        after.settle(t1 + Duration::from_secs(50), &mut changed);
        assert_eq!(after.get(&b), Some(home), "b takes its place once it ends");
        // Now the address b waited in is quarantined, for b.
        let spare = got.expect("b had an address");
        assert_eq!(
            after
                .quarantined(t1 + Duration::from_secs(50))
                .iter()
                .map(|v| (v.address, &v.released_by))
                .collect::<Vec<_>>(),
            [(spare, &b)]
        );

        // The one that let go of it may take it back.
        let (mut back_again, _) = restarted(t1);
        back_again.set(&a, dated(1));
        back_again.settle(t1, &mut BTreeSet::new());
        assert_eq!(back_again.get(&a), Some(home));
    }

    /// A quarantine whose end lies past one `--vip-quarantine` from the load (a clock ahead when
    /// it was written) is cut to one; an ended one and an address outside the range are dropped;
    /// a version 1 file (no quarantine line) still loads.
    #[test]
    fn restored_quarantines_are_bounded_and_old_files_load() {
        let cidr = VipCidr::range(242, 3, 0, 0, 27);
        let q = Duration::from_secs(300);
        let wall = SystemTime::now();
        let at = |ip: [u8; 4], until: SystemTime| {
            let now = Instant::now();
            let v = QuarantinedVip {
                address: Ipv4Addr::from(ip),
                released_by: ServiceKey::namespaced("ns", "a"),
                until: now + until.duration_since(wall).unwrap_or_default(),
            };
            SavedVip::of(&v, now, wall)
        };
        let saved = [
            at([242, 3, 0, 5], wall + Duration::from_secs(86_400)),
            at([242, 3, 0, 6], wall),
            at([10, 0, 0, 1], wall + Duration::from_secs(60)),
        ];
        let now = Instant::now();
        let mut v = Vips::new(cidr);
        v.set_quarantine(q);
        assert_eq!(v.restore_quarantine(&saved, wall, now), 1);
        let left = v.quarantined(now);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].address, Ipv4Addr::new(242, 3, 0, 5));
        assert_eq!(
            left[0].until,
            now + q,
            "at most one quarantine from the load"
        );

        let path = temp("v1");
        let mut v1 = HEADER_V1.to_vec();
        let s = snapshot();
        for e in s.iter() {
            prost::encoding::encode_varint(e.resource.len() as u64, &mut v1);
            v1.extend_from_slice(&e.resource);
        }
        std::fs::write(&path, v1).expect("write");
        let back = load(&path).expect("a version 1 file").expect("present");
        assert_eq!(back.snapshot.version, s.version);
        assert!(back.vip_quarantine.is_empty());
        // A line without the field (or with fields of a later version) loads too.
        let mut v2 = HEADER.to_vec();
        v2.extend_from_slice(b"{\"later\":1}\n");
        std::fs::write(&path, v2).expect("write");
        let back = load(&path).expect("no quarantine field").expect("present");
        assert!(back.vip_quarantine.is_empty());
        let _ = std::fs::remove_file(&path);
    }
}
