//! What a stream may hold ([`StreamLimits`](crate::limits::StreamLimits)), checked before a request is applied: the
//! lengths of the sink's strings, the types, the resource names, and the bytes of all the
//! sink's strings the stream keeps (delta subscriptions add up across requests).

use std::collections::{BTreeMap, BTreeSet};

use mcp_core::cache::Known;

use super::{type_hash, Engine, Names, Request};
use crate::limits::Refused;

impl Engine {
    /// Whether `req` keeps the stream within its limits; call it before [`Engine::on_request`]
    /// and end the stream with the error's status if not (nothing was applied then).
    pub fn check(&self, req: &Request) -> Result<(), Refused> {
        let limits = &self.limits;
        if req.type_key.len() > limits.max_type_url_len {
            return Err(Refused::TypeUrlLength {
                len: req.type_key.len(),
                limit: limits.max_type_url_len,
            });
        }
        if req.node_id_len > limits.max_node_id_len {
            return Err(Refused::NodeIdLength {
                len: req.node_id_len,
                limit: limits.max_node_id_len,
            });
        }
        if let Some(len) = longest_name(req).filter(|l| *l > limits.max_name_len) {
            return Err(Refused::ResourceNameLength {
                len,
                limit: limits.max_name_len,
            });
        }
        let served = (self.served)(&req.type_key);
        let state = self.types.get(&req.type_key);
        let known = if served {
            state.is_some()
        } else {
            self.unserved.contains_key(&type_hash(&req.type_key))
        };
        if !known && self.types.len() + self.unserved.len() >= limits.max_types {
            return Err(Refused::TypesPerStream {
                limit: limits.max_types,
            });
        }
        if !served {
            // Names of a type we do not serve are not kept.
            return Ok(());
        }
        let held = state.map_or(0, |s| s.sub.names.len());
        let held_bytes = state.map_or(0, |s| s.sub.bytes);
        // Names the type would hold after this request, and their bytes.
        let (count, sub_bytes) = match &req.names {
            Names::Unchanged => (0, held_bytes),
            Names::Replace(list) => (list.len(), list.iter().map(String::len).sum()),
            Names::Delta { subscribe, .. } => {
                let held_names = state.map(|s| &s.sub.names);
                let new: BTreeSet<&str> = subscribe
                    .iter()
                    .map(String::as_str)
                    .filter(|n| *n != "*" && !held_names.is_some_and(|h| h.contains(*n)))
                    .collect();
                let new_bytes: usize = new.iter().map(|n| n.len()).sum();
                (held + new.len(), held_bytes + new_bytes)
            }
        };
        let count = count.max(req.initial_versions.len());
        if count > limits.max_names {
            return Err(Refused::ResourceNames {
                type_url: req.type_key.clone(),
                count,
                limit: limits.max_names,
            });
        }
        // Only a type's first request keeps its URL and its declared versions.
        let added = if state.is_none() {
            req.type_key.len() + declared_bytes(&req.initial_versions)
        } else {
            0
        };
        let bytes = self.bytes_held() - held_bytes + sub_bytes + added;
        if bytes > limits.max_bytes {
            return Err(Refused::StreamBytes {
                bytes,
                limit: limits.max_bytes,
            });
        }
        Ok(())
    }

    /// Bytes of the sink's strings this stream holds (what `--max-stream-bytes` bounds): the
    /// served types' URLs, the names subscribed, and until a type's first response the names
    /// and versions declared held. Unserved types keep only a hash.
    pub fn bytes_held(&self) -> usize {
        self.types
            .iter()
            .map(|(url, s)| {
                let declared = if s.answered { 0 } else { s.declared_bytes };
                url.len() + s.sub.bytes + declared
            })
            .sum()
    }

    /// Resource names the sink made this stream hold: the names it subscribed to, and until its
    /// first response the names it declared held (`initial_resource_versions`). What the
    /// stream keeps of sets it was sent is the cache's data, bounded by the served set.
    pub fn names_held(&self) -> usize {
        self.types
            .values()
            .map(|s| {
                let declared = match &s.known {
                    Known::Versions(m) if !s.answered => m.len(),
                    _ => 0,
                };
                s.sub.names.len() + declared
            })
            .sum()
    }
}

/// The longest resource name or declared version a request carries.
fn longest_name(req: &Request) -> Option<usize> {
    let names: Box<dyn Iterator<Item = &String>> = match &req.names {
        Names::Unchanged => Box::new(std::iter::empty()),
        Names::Replace(list) => Box::new(list.iter()),
        Names::Delta {
            subscribe,
            unsubscribe,
        } => Box::new(subscribe.iter().chain(unsubscribe)),
    };
    let declared = req.initial_versions.iter().flat_map(|(n, v)| [n, v]);
    names.chain(declared).map(String::len).max()
}

/// Bytes of the names and versions a sink declares held.
pub(super) fn declared_bytes(versions: &BTreeMap<String, String>) -> usize {
    versions.iter().map(|(n, v)| n.len() + v.len()).sum()
}
