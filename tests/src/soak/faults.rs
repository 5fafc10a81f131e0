//! The faults a soak injects, and when: in the short run every kind once, one after another, on
//! chosen registries, then those that hit a registry once more on others; in a long run a random kind on a random registry, at exponential intervals
//! (a Poisson process) of the configured mean.

use std::time::Duration;

use super::Rng;

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// An adapter SIGKILLed, restarted on the same ports a few seconds later.
    AdapterKill,
    /// The adapter's connections to its registry cut (and new ones refused) for a while.
    RegistryCut,
    /// istiod's connection to an adapter cut (and new ones refused) for a while.
    IstiodCut,
    /// A registry restarted (same ports; what it keeps depends on the registry).
    RegistryRestart,
    /// istiod SIGKILLed, restarted on the same ports a few seconds later (Envoy reconnects).
    IstiodRestart,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 5] = [
        FaultKind::AdapterKill,
        FaultKind::RegistryCut,
        FaultKind::IstiodCut,
        FaultKind::RegistryRestart,
        FaultKind::IstiodRestart,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::AdapterKill => "adapter_sigkill",
            FaultKind::RegistryCut => "cut_adapter_to_registry",
            FaultKind::IstiodCut => "cut_istiod_to_adapter",
            FaultKind::RegistryRestart => "registry_restart",
            FaultKind::IstiodRestart => "istiod_restart",
        }
    }

    /// In the short run, the registries this kind hits (the first two running that can take
    /// it): quick restarts, and every adapter hit by some fault.
    fn preferred(self) -> &'static [&'static str] {
        match self {
            FaultKind::AdapterKill => &["nacos", "eureka", "consul", "file"],
            FaultKind::RegistryCut => &["kube", "zookeeper", "consul", "eureka"],
            FaultKind::IstiodCut => &["zookeeper", "file", "consul", "eureka"],
            FaultKind::RegistryRestart => &["consul", "zookeeper", "kube", "eureka"],
            FaultKind::IstiodRestart => &[],
        }
    }
}

/// One fault: its kind and the registry (index into the soak's drivers) it hits.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    /// What goes wrong.
    pub kind: FaultKind,
    /// The registry hit (`None` for istiod's restart).
    pub target: Option<usize>,
}

/// Which registries each kind can hit: `able(kind, index)`.
pub struct Schedule {
    /// The short run's faults still to come (empty in a long run).
    queue: Vec<Fault>,
    scheduled: bool,
    mean: Duration,
}

impl Schedule {
    /// The schedule over registries `names`; `able(kind, i)` says whether registry `i` can
    /// take `kind`. `scheduled`: every kind once, in [`FaultKind::ALL`]'s order, then
    /// once more on other registries.
    pub fn new(
        names: &[String],
        able: impl Fn(FaultKind, usize) -> bool,
        scheduled: bool,
        mean: Duration,
    ) -> Schedule {
        let mut queue = Vec::new();
        if scheduled {
            // Two passes: every kind on its first registry that can take it, then the kinds
            // that hit a registry once more on the next one (another adapter's code path).
            for pass in 0..2 {
                for kind in FaultKind::ALL {
                    if kind == FaultKind::IstiodRestart {
                        if pass == 0 {
                            queue.push(Fault { kind, target: None });
                        }
                        continue;
                    }
                    let mut candidates: Vec<usize> = kind
                        .preferred()
                        .iter()
                        .filter_map(|p| names.iter().position(|n| n == p))
                        .filter(|&i| able(kind, i))
                        .collect();
                    if candidates.is_empty() {
                        candidates.extend((0..names.len()).filter(|&i| able(kind, i)));
                    }
                    if let Some(&i) = candidates.get(pass) {
                        queue.push(Fault {
                            kind,
                            target: Some(i),
                        });
                    }
                }
            }
            queue.reverse();
        }
        Schedule {
            queue,
            scheduled,
            mean,
        }
    }

    /// Whether the short run's faults are not all done yet.
    pub fn pending(&self) -> bool {
        !self.queue.is_empty()
    }

    /// How long to drive before the next fault.
    pub fn gap(&self, rng: &mut Rng) -> Duration {
        if self.scheduled {
            return self.mean;
        }
        // Exponential with the configured mean, at least 5 s (a quiet point takes some).
        let u = rng.unit().max(1e-9);
        Duration::from_secs_f64((-u.ln() * self.mean.as_secs_f64()).max(5.0))
    }

    /// The next fault: the short run's next, or a random one that some registry can take.
    pub fn next(
        &mut self,
        rng: &mut Rng,
        count: usize,
        able: impl Fn(FaultKind, usize) -> bool,
    ) -> Option<Fault> {
        if self.scheduled {
            return self.queue.pop();
        }
        for _ in 0..20 {
            let kind = *rng.pick(&FaultKind::ALL);
            if kind == FaultKind::IstiodRestart {
                return Some(Fault { kind, target: None });
            }
            let able_ones: Vec<usize> = (0..count).filter(|&i| able(kind, i)).collect();
            if !able_ones.is_empty() {
                let target = Some(*rng.pick(&able_ones));
                return Some(Fault { kind, target });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_short_run_has_every_kind_once() {
        let names: Vec<String> = ["file", "consul", "kube"].map(String::from).to_vec();
        // The file registry has no connection to cut and no server to restart.
        let able = |k: FaultKind, i: usize| {
            i != 0 || matches!(k, FaultKind::AdapterKill | FaultKind::IstiodCut)
        };
        let mut s = Schedule::new(&names, able, true, Duration::from_secs(1));
        let mut rng = Rng::new(1);
        let mut kinds = Vec::new();
        while let Some(f) = s.next(&mut rng, 3, able) {
            kinds.push((f.kind, f.target));
        }
        assert_eq!(
            kinds,
            vec![
                (FaultKind::AdapterKill, Some(1)),
                (FaultKind::RegistryCut, Some(2)),
                (FaultKind::IstiodCut, Some(0)),
                (FaultKind::RegistryRestart, Some(1)),
                (FaultKind::IstiodRestart, None),
                (FaultKind::AdapterKill, Some(0)),
                (FaultKind::RegistryCut, Some(1)),
                (FaultKind::IstiodCut, Some(1)),
                (FaultKind::RegistryRestart, Some(2)),
            ]
        );
    }
}
