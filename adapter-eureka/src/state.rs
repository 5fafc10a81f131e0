//! The adapter's copy of the Eureka registry, kept the way Eureka's own client keeps it: replaced
//! by a full fetch, patched by deltas, and checked against the server's `apps__hashcode`.

use std::collections::{BTreeMap, BTreeSet};

use crate::dto::{Applications, Instance};

/// App name -> instance id -> instance (all statuses: the hash counts every instance).
#[derive(Clone, Debug, Default)]
pub struct LocalRegistry {
    apps: BTreeMap<String, BTreeMap<String, Instance>>,
}

impl LocalRegistry {
    /// The registry a full fetch returned.
    pub fn from_full(apps: Applications) -> Self {
        let mut reg = Self::default();
        for app in apps.application {
            let entry = reg.apps.entry(app.name.clone()).or_default();
            for inst in app.instance {
                entry.insert(inst.id(), inst);
            }
        }
        reg.apps.retain(|_, insts| !insts.is_empty());
        reg
    }

    /// Applies a delta (ADDED/MODIFIED upsert, DELETED removes; an app left with no instance
    /// goes); the apps it touched.
    pub fn apply_delta(&mut self, delta: Applications) -> BTreeSet<String> {
        let mut touched = BTreeSet::new();
        for app in delta.application {
            for inst in app.instance {
                let name = if inst.app.is_empty() {
                    app.name.clone()
                } else {
                    inst.app.clone()
                };
                let id = inst.id();
                match inst.action_type.as_deref() {
                    Some("DELETED") => {
                        if let Some(insts) = self.apps.get_mut(&name) {
                            insts.remove(&id);
                            if insts.is_empty() {
                                self.apps.remove(&name);
                            }
                        }
                    }
                    _ => {
                        self.apps.entry(name.clone()).or_default().insert(id, inst);
                    }
                }
                touched.insert(name);
            }
        }
        touched
    }

    /// Eureka's reconcile hash: `STATUS_count_` for each status present, statuses sorted by
    /// name (`DOWN_1_UP_3_`; `""` when empty). Counts the server-computed `status`.
    pub fn reconcile_hash(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for inst in self.apps.values().flat_map(BTreeMap::values) {
            *counts.entry(inst.status.as_str()).or_default() += 1;
        }
        counts.iter().map(|(s, n)| format!("{s}_{n}_")).collect()
    }

    /// Instances of one app, by id.
    pub fn app(&self, name: &str) -> Option<&BTreeMap<String, Instance>> {
        self.apps.get(name)
    }

    /// App names.
    pub fn app_names(&self) -> impl Iterator<Item = &String> {
        self.apps.keys()
    }

    /// Number of instances in all apps.
    pub fn instance_count(&self) -> usize {
        self.apps.values().map(BTreeMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dto::{Application, Applications};

    fn inst(app: &str, id: &str, status: &str, action: &str) -> Instance {
        Instance {
            instance_id: Some(id.into()),
            host_name: id.into(),
            app: app.into(),
            ip_addr: "10.0.0.1".into(),
            status: status.into(),
            action_type: Some(action.into()),
            ..Instance::default()
        }
    }

    fn apps(list: Vec<Instance>) -> Applications {
        let mut by: BTreeMap<String, Vec<Instance>> = BTreeMap::new();
        for i in list {
            by.entry(i.app.clone()).or_default().push(i);
        }
        Applications {
            apps_hashcode: None,
            application: by
                .into_iter()
                .map(|(name, instance)| Application { name, instance })
                .collect(),
        }
    }

    #[test]
    fn delta_then_hash() {
        let mut r = LocalRegistry::from_full(apps(vec![
            inst("A", "a1", "UP", "ADDED"),
            inst("A", "a2", "UP", "ADDED"),
            inst("B", "b1", "DOWN", "ADDED"),
        ]));
        assert_eq!(r.reconcile_hash(), "DOWN_1_UP_2_");
        let touched = r.apply_delta(apps(vec![
            inst("A", "a2", "OUT_OF_SERVICE", "MODIFIED"),
            inst("B", "b1", "DOWN", "DELETED"),
            inst("C", "c1", "UP", "ADDED"),
        ]));
        assert_eq!(touched.into_iter().collect::<Vec<_>>(), ["A", "B", "C"]);
        assert_eq!(r.reconcile_hash(), "OUT_OF_SERVICE_1_UP_2_");
        assert!(r.app("B").is_none(), "app without instances removed");
        assert_eq!(LocalRegistry::default().reconcile_hash(), "");
    }
}
