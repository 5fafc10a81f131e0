//! The virtual IP quarantine as `--state-file` keeps it, so a restart during a quarantine does
//! not hand the address over (#43 item 9).
//!
//! The served addresses need no saving: the placement is a function of the set and the
//! registry's dates, the same after a restart. The quarantine is history (who let go of which
//! address, and when); lost, a restarted adapter serves the placement at once, and a service
//! waiting for a quarantined address takes it while clients may still reach its last holder
//! there.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime};

use crate::model::ServiceKey;

/// An address in quarantine (`--vip-quarantine`): until `until` no service but the one that
/// let go of it gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuarantinedVip {
    /// The address.
    pub address: Ipv4Addr,
    /// The service that let go of it (it alone may take it back).
    pub released_by: ServiceKey,
    /// When the quarantine ends.
    pub until: Instant,
}

/// A [`QuarantinedVip`] in the state file.
///
/// The end is wall-clock time, not an [`Instant`]: an `Instant` means nothing to another process
/// (it counts from an unspecified point, on Linux the boot), and the file is read by the next
/// run, maybe on another boot. Wall-clock time can jump, so what a load makes of it is bounded
/// ([`SavedVip::remaining`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedVip {
    /// The address.
    pub address: Ipv4Addr,
    /// The namespace of the service that let go of it (none: the adapter's `--namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// When the quarantine ends: milliseconds since the Unix epoch.
    pub until_unix_ms: u64,
}

impl SavedVip {
    /// `q` to save, its end read on the wall clock: `wall` is the wall-clock time at `now`.
    pub fn of(q: &QuarantinedVip, now: Instant, wall: SystemTime) -> Self {
        let end = wall + q.until.saturating_duration_since(now);
        Self {
            address: q.address,
            namespace: q.released_by.namespace.clone(),
            name: q.released_by.name.clone(),
            until_unix_ms: unix_ms(end),
        }
    }

    /// The service that let go of the address.
    pub fn released_by(&self) -> ServiceKey {
        ServiceKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// What is left of the quarantine at the wall-clock time `wall`, at most `quarantine`;
    /// `None` once it ended. A file written by a clock ahead (or read after the clock was set
    /// back) would otherwise keep an address from every other service for as long as the
    /// clocks differ: at most one `--vip-quarantine` from the load, the longest it could have
    /// had left. A clock that jumped forward ends it early (at worst as a restart without the
    /// file did).
    pub fn remaining(&self, wall: SystemTime, quarantine: Duration) -> Option<Duration> {
        let left = Duration::from_millis(self.until_unix_ms.saturating_sub(unix_ms(wall)));
        Some(left.min(quarantine)).filter(|d| !d.is_zero())
    }
}

/// Milliseconds since the Unix epoch (0 before it: a clock that far off ends every quarantine).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_is_kept_within_one_quarantine_of_the_load() {
        let q = Duration::from_secs(300);
        let now = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let saved = SavedVip::of(
            &QuarantinedVip {
                address: Ipv4Addr::new(242, 1, 0, 7),
                released_by: ServiceKey::namespaced("ns", "a"),
                until: now + Duration::from_secs(120),
            },
            now,
            wall,
        );
        assert_eq!(saved.released_by(), ServiceKey::namespaced("ns", "a"));
        let later = wall + Duration::from_secs(20);
        assert_eq!(saved.remaining(later, q), Some(Duration::from_secs(100)));
        assert_eq!(saved.remaining(wall + Duration::from_secs(120), q), None);
        // Read by a clock set back a day: no more than one quarantine.
        let behind = wall - Duration::from_secs(86_400);
        assert_eq!(saved.remaining(behind, q), Some(q));
        assert_eq!(saved.remaining(later, Duration::ZERO), None);
        let json = serde_json::to_string(&saved).expect("json");
        assert_eq!(
            json,
            r#"{"address":"242.1.0.7","namespace":"ns","name":"a","untilUnixMs":1700000120000}"#
        );
        let back: SavedVip = serde_json::from_str(&json).expect("parsed");
        assert_eq!(back, saved);
    }
}
