//! Every subscribed service's name (the model key, the ServiceEntry's name, the host before the
//! suffix): `{service}.{group}.{namespace}` mapped to DNS, unless another service maps to the
//! same name.
//!
//! Nacos names are case-sensitive and allow characters DNS does not, so different services can
//! map alike: `Orders` and `orders`, `a_b` and `a-b`, namespaces `dev_1` and `dev-1`, long names
//! cut at 63 bytes per label. Left alone, one host would serve another service's endpoints. Of
//! the services sharing a name, the one whose parts are already written as DNS writes them keeps
//! it (`orders` over `Orders`), ties going to the smaller id in byte order; each other one gets
//! its service label with `-{8 hex of FNV-1a(namespace, group, service)}` appended. That is
//! decided from the registry's names alone, so every replica and restart agrees, and each
//! renamed service is listed under the adapter's problems.

use std::collections::BTreeMap;

use mcp_core::translate::naming::{fnv1a32, label_with_hash, map_dns_label, map_dns_name};

use crate::convert::ServiceId;

/// The problem scope that lists renamed services.
pub const SCOPE: &str = "nacos service names";

/// The names given to a set of services.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Names {
    assigned: BTreeMap<ServiceId, String>,
    problems: Vec<String>,
}

impl Names {
    /// Names for every service of `ids`.
    pub fn assign<'a>(ids: impl IntoIterator<Item = &'a ServiceId>) -> Names {
        let mut by_name: BTreeMap<String, Vec<&ServiceId>> = BTreeMap::new();
        for id in ids {
            by_name.entry(readable(id)).or_default().push(id);
        }
        let mut out = Names::default();
        for (name, mut ids) in by_name {
            // Most exact first, then byte order: the first keeps the readable name.
            ids.sort_by_key(|id| (std::cmp::Reverse(exact_parts(id)), *id));
            let mut it = ids.into_iter();
            let Some(keeper) = it.next() else { continue };
            out.assigned.insert(keeper.clone(), name.clone());
            for id in it {
                let hashed = hashed(id);
                out.problems.push(format!(
                    "nacos services {keeper} and {id} both map to name {name}; {id} is served as {hashed}"
                ));
                out.assigned.insert(id.clone(), hashed);
            }
        }
        out
    }

    /// The name of `id`, if it is one of the set.
    pub fn get(&self, id: &ServiceId) -> Option<&str> {
        self.assigned.get(id).map(String::as_str)
    }

    /// One line per renamed service.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// The services whose name differs between `self` and `other` (either lacks it, or it is
    /// another name).
    pub fn changed<'a>(&'a self, other: &'a Names) -> impl Iterator<Item = &'a ServiceId> + 'a {
        self.assigned
            .iter()
            .filter(move |(id, n)| other.assigned.get(*id) != Some(*n))
            .map(|(id, _)| id)
    }
}

/// `{service}.{group}.{namespace}`, each part mapped; a part that maps to nothing is named by
/// its hash.
fn readable(id: &ServiceId) -> String {
    let or_hash = |mapped: String, raw: &str| {
        if mapped.is_empty() {
            format!("{:08x}", fnv1a32(&[raw]))
        } else {
            mapped
        }
    };
    format!(
        "{}.{}.{}",
        or_hash(map_dns_name(&id.name), &id.name),
        or_hash(map_dns_label(&id.group), &id.group),
        or_hash(map_dns_label(&id.namespace), &id.namespace)
    )
}

/// How many of the id's parts are written as their mapping writes them.
fn exact_parts(id: &ServiceId) -> usize {
    [
        map_dns_name(&id.name) == id.name,
        map_dns_label(&id.group) == id.group,
        map_dns_label(&id.namespace) == id.namespace,
    ]
    .into_iter()
    .filter(|e| *e)
    .count()
}

/// The readable name with the service part's last label hashed.
fn hashed(id: &ServiceId) -> String {
    let hash = fnv1a32(&["nacos", &id.namespace, &id.group, &id.name]);
    let mut labels: Vec<String> = readable(id).split('.').map(str::to_string).collect();
    // The group and the namespace are the last two labels; the service has at least one.
    let service_last = labels.len().saturating_sub(3);
    labels[service_last] = label_with_hash(&labels[service_last], hash);
    labels.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ns: &str, group: &str, name: &str) -> ServiceId {
        ServiceId::new(ns, group, name)
    }

    #[test]
    fn services_that_map_alike_get_distinct_names_decided_by_the_names_alone() {
        let ids = [
            id("public", "DEFAULT_GROUP", "Orders"),
            id("public", "DEFAULT_GROUP", "orders"),
            id("public", "DEFAULT_GROUP", "a_b"),
            id("public", "DEFAULT_GROUP", "a-b"),
            id("dev_1", "DEFAULT_GROUP", "cart"),
            id("dev-1", "DEFAULT_GROUP", "cart"),
            id("public", "DEFAULT_GROUP", "payments"),
        ];
        let names = Names::assign(&ids);
        // The exact spelling keeps the readable name.
        assert_eq!(names.get(&ids[1]), Some("orders.default-group.public"));
        assert_eq!(names.get(&ids[3]), Some("a-b.default-group.public"));
        assert_eq!(names.get(&ids[5]), Some("cart.default-group.dev-1"));
        assert_eq!(names.get(&ids[6]), Some("payments.default-group.public"));
        for loser in [&ids[0], &ids[2], &ids[4]] {
            let n = names.get(loser).expect("named");
            let readable = readable(loser);
            assert_ne!(n, readable);
            let (service, rest) = n.split_once('.').expect("dotted");
            assert_eq!(rest, readable.split_once('.').expect("dotted").1);
            assert!(service.len() <= 63 && service.contains('-'), "{n}");
        }
        assert_eq!(names.problems().len(), 3, "{:?}", names.problems());
        assert!(
            names
                .problems()
                .iter()
                .any(|p| p.contains("public/DEFAULT_GROUP/Orders")
                    && p.contains("public/DEFAULT_GROUP/orders")),
            "{:?}",
            names.problems()
        );
        // Every name distinct.
        let mut all: Vec<&str> = ids.iter().filter_map(|i| names.get(i)).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), ids.len());

        // Any order in, the same names out: what another replica computes.
        let mut reversed = ids.to_vec();
        reversed.reverse();
        assert_eq!(Names::assign(&reversed), names);
    }

    #[test]
    fn labels_cut_at_63_bytes_collide_and_are_told_apart() {
        let long = "x".repeat(70);
        let a = id("public", "G", &format!("{long}a"));
        let b = id("public", "G", &format!("{long}b"));
        let names = Names::assign([&a, &b]);
        let (na, nb) = (names.get(&a).expect("a"), names.get(&b).expect("b"));
        assert_ne!(na, nb);
        for n in [na, nb] {
            assert!(n.split('.').all(|l| !l.is_empty() && l.len() <= 63), "{n}");
        }
        // Only one service: no problem, no change.
        let alone = Names::assign([&a]);
        assert!(alone.problems().is_empty());
        assert_eq!(alone.changed(&names).count(), 0, "a keeps its name");
        assert_eq!(names.changed(&alone).collect::<Vec<_>>(), [&b]);
    }

    #[test]
    fn a_dotted_dubbo_name_keeps_its_dots_and_an_unmappable_part_is_hashed() {
        let d = id(
            "public",
            "DEFAULT_GROUP",
            "providers:com.example.Greeter:1.0.0:",
        );
        assert_eq!(
            Names::assign([&d]).get(&d),
            Some("providers-com.example.greeter-1.0.0.default-group.public")
        );
        let odd = id("public", "___", "orders");
        let n = Names::assign([&odd]).get(&odd).expect("named").to_string();
        assert!(n.split('.').all(|l| !l.is_empty()), "{n}");
    }
}
