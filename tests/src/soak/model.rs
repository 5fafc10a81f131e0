//! The soak's model of what each registry was told to hold (bounded: 5-20 services of 1-5
//! instances each, so a long run oscillates around one size) and the random operations on it;
//! the drivers ([`super::drivers`], [`super::jvm_drivers`]) write each operation to their
//! registry.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use super::drivers::Driver;
use super::Rng;
use crate::registries::Registry;

/// Every service of the soak listens on this port (one outbound listener in the sidecar: no
/// capture, so it binds 127.0.0.1:PORT), chosen away from other tests' ports.
pub const PORT: u16 = 18473;

/// Services per registry: never fewer (a removal waits), never more (an addition waits).
pub const SERVICES: (usize, usize) = (5, 20);
/// Instances per service.
pub const INSTANCES: (usize, usize) = (1, 5);

/// Host -> its healthy endpoints (`ip:port`), as a registry holds them or as a view shows them.
pub type Truth = BTreeMap<String, BTreeSet<String>>;

/// One instance as the model holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    /// Its address (unique in the run: never reused, so a stale endpoint is never mistaken for
    /// a new one).
    pub ip: Ipv4Addr,
    /// Passing, UP, ready, enabled.
    pub healthy: bool,
}

/// One service as the model holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Svc {
    /// Instances by id.
    pub insts: BTreeMap<String, Inst>,
    /// Its metadata generation: a "change" bumps it, written as the `version` label or
    /// metadata of every instance (and the Kubernetes Service's labels).
    pub version: u32,
}

impl Svc {
    /// The `version` label value.
    pub fn version_label(&self) -> String {
        format!("v{}", self.version)
    }
}

/// What a registry was told to hold.
#[derive(Debug, Default)]
pub struct Model {
    /// Services by name.
    pub services: BTreeMap<String, Svc>,
    /// Second octet of this registry's addresses (10.N.x.y).
    net: u8,
    /// Addresses handed out so far.
    next_ip: u32,
}

/// The operations the driver performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// A service with 1-3 instances.
    AddService,
    /// A service's metadata (every instance's `version`) changed.
    ChangeService,
    /// A service and all its instances removed.
    RemoveService,
    /// An instance added to a service.
    AddInstance,
    /// An instance removed from a service.
    RemoveInstance,
    /// An instance's health flipped.
    FlipHealth,
}

impl OpKind {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::AddService => "add_service",
            OpKind::ChangeService => "change_service",
            OpKind::RemoveService => "remove_service",
            OpKind::AddInstance => "add_instance",
            OpKind::RemoveInstance => "remove_instance",
            OpKind::FlipHealth => "flip_health",
        }
    }
}

/// One change, for the driver to write: service `svc`, before and after, and the one
/// instance that changed (`None`: the service as a whole).
pub struct Edit<'a> {
    /// The service's name.
    pub svc: &'a str,
    /// The service before (`None`: it is new).
    pub before: Option<&'a Svc>,
    /// The service after (`None`: it is removed).
    pub after: Option<&'a Svc>,
    /// The instance that changed, when only one did (only while the service stays: a removed
    /// service is a change of the whole).
    pub inst: Option<&'a str>,
}

impl Edit<'_> {
    /// The instances the edit touches: the one that changed, or every instance of the service
    /// (after the edit, or before it when the service is removed).
    pub fn ids(&self) -> Vec<String> {
        match self.inst {
            Some(id) => vec![id.to_string()],
            None => self
                .after
                .or(self.before)
                .map(|s| s.insts.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

impl Model {
    /// An empty model whose addresses are 10.`net`.x.y.
    pub fn new(net: u8) -> Model {
        Model {
            net,
            ..Model::default()
        }
    }

    fn new_inst(&mut self, rng: &mut Rng) -> (String, Inst) {
        let n = self.next_ip;
        self.next_ip += 1;
        let ip = Ipv4Addr::new(10, self.net, (n / 250 % 250) as u8, (n % 250 + 1) as u8);
        let id = format!("i{n}");
        let healthy = rng.chance(0.8);
        (id, Inst { ip, healthy })
    }

    /// Picks an operation the bounds allow, applies it to the model and has `driver` write
    /// it. Its kind.
    pub fn step(&mut self, rng: &mut Rng, driver: &mut dyn Driver) -> OpKind {
        let n = self.services.len();
        let growable: Vec<String> = self.names(|s| s.insts.len() < INSTANCES.1);
        let shrinkable: Vec<String> = self.names(|s| s.insts.len() > INSTANCES.0);
        let mut choices: Vec<(OpKind, u32)> = vec![(OpKind::ChangeService, 2)];
        if n < SERVICES.1 {
            choices.push((OpKind::AddService, if n < SERVICES.0 { 100 } else { 2 }));
        }
        if n > SERVICES.0 {
            choices.push((OpKind::RemoveService, 2));
        }
        if !growable.is_empty() {
            choices.push((OpKind::AddInstance, 3));
        }
        if !shrinkable.is_empty() {
            choices.push((OpKind::RemoveInstance, 3));
        }
        if n > 0 {
            choices.push((OpKind::FlipHealth, 4));
        }
        let total: u32 = choices.iter().map(|c| c.1).sum();
        let mut roll = rng.below(total as usize) as u32;
        let kind = choices
            .iter()
            .find(|(_, w)| {
                if roll < *w {
                    true
                } else {
                    roll -= w;
                    false
                }
            })
            .map_or(OpKind::ChangeService, |c| c.0);
        let kind = if n == 0 { OpKind::AddService } else { kind };
        match kind {
            OpKind::AddService => {
                let free: Vec<String> = (0..SERVICES.1 * 2)
                    .map(|i| format!("svc-{i:02}"))
                    .filter(|s| !self.services.contains_key(s))
                    .collect();
                let name = rng.pick(&free).clone();
                let mut svc = Svc::default();
                for _ in 0..1 + rng.below(3) {
                    let (id, inst) = self.new_inst(rng);
                    svc.insts.insert(id, inst);
                }
                self.services.insert(name.clone(), svc);
                self.write(driver, &name, None, None);
            }
            OpKind::ChangeService => {
                let name = self.pick_service(rng, |_| true);
                let before = self.services[&name].clone();
                if let Some(s) = self.services.get_mut(&name) {
                    s.version += 1;
                }
                self.write(driver, &name, Some(before), None);
            }
            OpKind::RemoveService => {
                let name = self.pick_service(rng, |_| true);
                let before = self.services.remove(&name);
                self.write(driver, &name, before, None);
            }
            OpKind::AddInstance => {
                let name = rng.pick(&growable).clone();
                let before = self.services[&name].clone();
                let (id, inst) = self.new_inst(rng);
                if let Some(s) = self.services.get_mut(&name) {
                    s.insts.insert(id.clone(), inst);
                }
                self.write(driver, &name, Some(before), Some(&id));
            }
            OpKind::RemoveInstance => {
                let name = rng.pick(&shrinkable).clone();
                let before = self.services[&name].clone();
                let ids: Vec<String> = before.insts.keys().cloned().collect();
                let id = rng.pick(&ids).clone();
                if let Some(s) = self.services.get_mut(&name) {
                    s.insts.remove(&id);
                }
                self.write(driver, &name, Some(before), Some(&id));
            }
            OpKind::FlipHealth => {
                let name = self.pick_service(rng, |_| true);
                let before = self.services[&name].clone();
                let ids: Vec<String> = before.insts.keys().cloned().collect();
                let id = rng.pick(&ids).clone();
                if let Some(i) = self
                    .services
                    .get_mut(&name)
                    .and_then(|s| s.insts.get_mut(&id))
                {
                    i.healthy = !i.healthy;
                }
                self.write(driver, &name, Some(before), Some(&id));
            }
        }
        kind
    }

    /// Every instance: its service's name, the service, its id.
    pub fn instances(&self) -> impl Iterator<Item = (&str, &Svc, &str)> {
        self.services.iter().flat_map(|(name, s)| {
            s.insts
                .keys()
                .map(move |id| (name.as_str(), s, id.as_str()))
        })
    }

    fn names(&self, keep: impl Fn(&Svc) -> bool) -> Vec<String> {
        self.services
            .iter()
            .filter(|(_, s)| keep(s))
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn pick_service(&self, rng: &mut Rng, keep: impl Fn(&Svc) -> bool) -> String {
        rng.pick(&self.names(keep)).clone()
    }

    fn write(&self, driver: &mut dyn Driver, svc: &str, before: Option<Svc>, inst: Option<&str>) {
        driver.apply(
            self,
            &Edit {
                svc,
                before: before.as_ref(),
                after: self.services.get(svc),
                inst,
            },
        );
    }

    /// What the registry should hold by the driver's own account, as a [`Truth`] (hosts named
    /// by `registry`): compared with the registry's truth, it tells a registry that lost writes
    /// (or a driver bug) from an adapter that lost them.
    pub fn expected(&self, registry: &dyn Registry) -> Truth {
        self.services
            .iter()
            .map(|(name, s)| {
                let eps = s
                    .insts
                    .values()
                    .filter(|i| i.healthy)
                    .map(|i| format!("{}:{PORT}", i.ip))
                    .collect();
                (registry.host(name), eps)
            })
            .collect()
    }
}
