//! The leader's metadata-only list of the output's namespaces: which ServiceEntries are this
//! process's, which are another writer's, and who that writer is.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use tokio::time::Instant;

use super::client::status_code;
use super::lease::LEASE_DURATION;
use super::object::{
    self, Claim, ANNOTATION_CONFIG, ANNOTATION_VERSION, FIELD_MANAGER, LABEL_SHARD,
};
use super::plan::{Ledger, Written};
use super::sync::{ObjectWriter, SyncError};
use crate::OwnerConflict;
use mcp_core::clip::clip_error;

/// Page size of the metadata list.
const LIST_PAGE: u32 = 500;

/// A Lease this process has seen unchanged for longer than its duration plus this (by this
/// process's own clock) has no live holder: its objects are taken over. The margin covers a
/// holder's renewal retries.
const LEASE_GRACE: Duration = Duration::from_secs(15);

/// Other writers' Leases as last seen: their resourceVersion and since when (this process's
/// clock) it has been that. A Lease's holder is judged by whether the Lease changes, as
/// client-go's leader election judges one: its `renewTime` was written by another machine's
/// clock, which may be minutes off this one's (`lease.rs` never compares them either).
#[derive(Debug, Default)]
pub(crate) struct LeasesSeen(HashMap<String, (String, Instant)>);

impl LeasesSeen {
    /// Records that `lease` is at `version` now; how long it has been unchanged.
    fn unchanged_for(&mut self, lease: &str, version: &str, now: Instant) -> Duration {
        match self.0.get(lease) {
            Some((v, since)) if v == version => now.duration_since(*since),
            _ => {
                self.0.insert(lease.to_string(), (version.to_string(), now));
                Duration::ZERO
            }
        }
    }
}

/// What a list found.
#[derive(Debug, Default)]
pub(super) struct Listed {
    /// This process's objects and the names it must not touch.
    pub ledger: Ledger,
    /// Other live writers of objects with this adapter's labels.
    pub owner_conflicts: Vec<OwnerConflict>,
    /// Output namespaces that could not be listed (403, 404), with the reason: their names are
    /// neither written nor deleted until they can.
    pub unreadable: BTreeMap<String, String>,
}

/// Whether a Lease has a live holder, and who.
enum Holder {
    Live(String),
    Gone,
}

impl ObjectWriter {
    /// Every ServiceEntry in the output's namespaces, metadata only, sorted by whose it is. On
    /// the first list after taking the Lease (`first`), an object of ours whose spec another
    /// field manager touched (a hand edit while no one led) is marked to be written again.
    pub(super) async fn list(&mut self, first: bool) -> Result<Listed, SyncError> {
        let scopes: Vec<Option<String>> = if self.namespaces.is_empty() {
            vec![None]
        } else {
            self.namespaces.iter().cloned().map(Some).collect()
        };
        let mut listed = Listed::default();
        let mut leases: BTreeMap<String, Holder> = BTreeMap::new();
        let mut conflicts: BTreeMap<String, (String, usize)> = BTreeMap::new();
        for scope in scopes {
            let api = self.api(scope.as_deref());
            let mut params = ListParams::default().limit(LIST_PAGE);
            loop {
                self.limiter.acquire().await;
                let page = api.list_metadata(&params).await;
                self.count("list", page.as_ref().map(|_| ()));
                let page = match (page, &scope) {
                    (Ok(page), _) => page,
                    // One namespace the output may not read (RBAC) or that does not exist: say
                    // so and keep the others going.
                    (Err(e), Some(ns)) if matches!(status_code(&e), Some(403 | 404)) => {
                        listed
                            .unreadable
                            .insert(ns.clone(), clip_error(e.to_string()));
                        break;
                    }
                    (Err(source), _) => {
                        return Err(SyncError::List {
                            where_: scope
                                .as_ref()
                                .map(|ns| format!(" in namespace {ns}"))
                                .unwrap_or_default(),
                            source,
                        })
                    }
                };
                for item in &page.items {
                    self.sort(
                        &item.metadata,
                        first,
                        &mut listed.ledger,
                        &mut leases,
                        &mut conflicts,
                    )
                    .await;
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
        }
        listed.owner_conflicts = conflicts
            .into_iter()
            .map(|(lease, (holder, objects))| OwnerConflict {
                lease,
                holder,
                objects,
            })
            .collect();
        tracing::info!(
            objects = listed.ledger.written.len(),
            foreign = listed.ledger.foreign.len(),
            other_writers = listed.owner_conflicts.len(),
            unreadable = listed.unreadable.len(),
            "Kubernetes output: listed the API server's ServiceEntries."
        );
        Ok(listed)
    }

    /// Files one listed object under the ledger: ours (or stranded and taken over), a sibling
    /// shard's (skipped), or foreign (with the other live writer noted).
    async fn sort(
        &mut self,
        meta: &ObjectMeta,
        first: bool,
        ledger: &mut Ledger,
        leases: &mut BTreeMap<String, Holder>,
        conflicts: &mut BTreeMap<String, (String, usize)>,
    ) {
        let name = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let labels = meta.labels.clone().unwrap_or_default();
        let annotations = meta.annotations.clone().unwrap_or_default();
        let mut adopted = false;
        let stranded = match self
            .owner
            .classify(&self.stamp.lease, &labels, &annotations)
        {
            Claim::Ours => false,
            Claim::Stranded => true,
            Claim::Sibling => return,
            Claim::NotOurs => {
                ledger.foreign.insert(name);
                return;
            }
            Claim::OtherLease {
                lease,
                other_layout,
            } => {
                if !leases.contains_key(&lease) {
                    let holder = self.holder(&lease).await;
                    leases.insert(lease.clone(), holder);
                }
                // Its writer lives: another adapter's (or the other layout's, until it stops).
                // Its writer is gone: this adapter's own under an earlier Lease or layout, else
                // a differently configured adapter's, never taken (it may be restarting).
                let holder = match leases.get(&lease) {
                    Some(Holder::Live(holder)) => Some(holder.clone()),
                    _ if other_layout => None,
                    _ if annotations.get(ANNOTATION_CONFIG) == Some(&self.stamp.config) => None,
                    _ => Some("nobody now (the Lease is not held)".to_string()),
                };
                if let Some(holder) = holder {
                    let c = conflicts.entry(lease).or_insert_with(|| (holder, 0));
                    c.1 += 1;
                    ledger.foreign.insert(name);
                    return;
                }
                // Its writer is gone: taken over, and written once more to carry this
                // process's Lease (else every list would look the old one up again).
                adopted = true;
                other_layout
            }
        };
        let mut version = annotations
            .get(ANNOTATION_VERSION)
            .cloned()
            .unwrap_or_default();
        if adopted || (first && edited_by_hand(meta)) {
            // Written again, with force: the edit is repaired.
            version.clear();
        }
        ledger.written.insert(
            name,
            Written {
                version,
                shard: labels.get(LABEL_SHARD).cloned(),
                uid: meta.uid.clone().unwrap_or_default(),
                generation: meta.generation,
                stranded: stranded.then_some(1),
            },
        );
    }

    /// Whether the Lease `namespace/name` has a live holder: it has one, and this process has
    /// not seen it unchanged for its duration plus [`LEASE_GRACE`]. A Lease seen for the first
    /// time has one (its objects are looked at again at the next list, within seconds while
    /// there is such a conflict). A Lease this process cannot read counts as live: its objects
    /// are left alone rather than taken.
    async fn holder(&mut self, lease: &str) -> Holder {
        let (ns, name) = object::split_name(lease);
        let api: Api<Lease> = Api::namespaced(self.client.clone(), ns);
        self.limiter.acquire().await;
        match api.get_opt(name).await {
            Ok(Some(l)) => {
                let version = l.metadata.resource_version.clone().unwrap_or_default();
                let spec = l.spec.unwrap_or_default();
                let holder = spec.holder_identity.unwrap_or_default();
                let held_for = Duration::from_secs(
                    spec.lease_duration_seconds
                        .map_or(LEASE_DURATION.as_secs(), |s| s.max(1) as u64),
                ) + LEASE_GRACE;
                let unchanged = self
                    .leases_seen
                    .unchanged_for(lease, &version, Instant::now());
                if holder.is_empty() || unchanged >= held_for {
                    Holder::Gone
                } else {
                    Holder::Live(holder)
                }
            }
            Ok(None) => Holder::Gone,
            Err(e) => Holder::Live(format!(
                "unknown (cannot read the Lease: {})",
                clip_error(e.to_string())
            )),
        }
    }
}

/// Whether a manager other than the output's changed the object's spec (its `managedFields`
/// give the spec's fields to someone else): a hand edit (`kubectl edit`, `apply`, a script).
fn edited_by_hand(meta: &ObjectMeta) -> bool {
    meta.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() != Some(FIELD_MANAGER)
            && m.subresource.as_deref().unwrap_or_default().is_empty()
            && m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.get("f:spec").is_some())
    })
}
