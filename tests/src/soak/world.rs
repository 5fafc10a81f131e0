//! The soak's world and run: the registries (each adapter reaching its registry through a cut
//! proxy where one can stand in between), istiod reading every adapter through a cut proxy of
//! its own, one Envoy sidecar under istiod; then drive, fault, heal, compare, until the end.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;

use super::compare::{diff_all, views};
use super::drivers::{ConsulDriver, Driver, FileDriver, KubeDriver};
use super::faults::{Fault, FaultKind, Schedule};
use super::jvm_drivers::{EurekaDriver, NacosDriver, ZkDriver};
use super::model::{Model, Truth, PORT, SERVICES};
use super::report::{HeapSample, Quiet, Report};
use super::{Rng, SoakConfig};
use crate::cut_proxy::CutProxy;
use crate::kube::KubeApiServer;
use crate::mesh::{apply, mesh_api_server, sidecar_scope, Mesh};
use crate::registries::{
    ConsulRegistry, EurekaRegistry, FileRegistry, KubeRegistry, NacosRegistry, ZkRegistry,
};

/// How long a connection stays cut, an adapter or istiod stays dead.
const OUTAGE: Duration = Duration::from_secs(5);

/// Everything the soak runs.
pub struct World {
    cfg: SoakConfig,
    names: Vec<String>,
    drivers: Vec<Box<dyn Driver>>,
    models: Vec<Model>,
    /// Per registry, the proxy between the adapter and its registry (if one can stand there).
    registry_proxies: Vec<Option<CutProxy>>,
    /// Per registry, the proxy between istiod and the adapter.
    istiod_proxies: Vec<CutProxy>,
    mesh: Mesh,
    _mesh_kube: KubeApiServer,
    rng: Rng,
    turn: usize,
    /// The run's measurements.
    pub report: Report,
}

/// Starts registry `name` with its adapter.
fn start_driver(name: &str) -> Box<dyn Driver> {
    match name {
        "file" => Box::new(FileDriver {
            reg: FileRegistry::start(PORT),
        }),
        "consul" => Box::new(ConsulDriver {
            reg: ConsulRegistry::start(),
        }),
        "kube" => Box::new(KubeDriver::new(KubeRegistry::start(PORT))),
        "zookeeper" => Box::new(ZkDriver {
            reg: ZkRegistry::start(),
        }),
        "eureka" => Box::new(EurekaDriver::new(EurekaRegistry::start())),
        "nacos" => Box::new(NacosDriver::new(NacosRegistry::start())),
        other => panic!("SOAK_REGISTRIES: unknown registry {other:?}"),
    }
}

impl World {
    /// Starts every registry of `cfg` with its adapter (side by side), the mesh cluster,
    /// istiod and Envoy, and fills each registry to its lower bound of services.
    pub fn start(cfg: SoakConfig) -> World {
        let t = Instant::now();
        let names = cfg.registries.clone();
        let (drivers, mesh_kube) = std::thread::scope(|s| {
            let kube = s.spawn(mesh_api_server);
            let started: Vec<_> = names
                .iter()
                .map(|n| s.spawn(move || start_driver(n)))
                .collect();
            let drivers: Vec<Box<dyn Driver>> = started
                .into_iter()
                .map(|h| h.join().expect("a registry started"))
                .collect();
            (drivers, kube.join().expect("mesh API server"))
        });
        eprintln!("soak: registries and adapters up in {:?}", t.elapsed());
        let mut drivers = drivers;
        let registry_proxies: Vec<Option<CutProxy>> = drivers
            .iter_mut()
            .map(|d| {
                let proxy = CutProxy::start(d.upstream()?);
                let args = d.args_via(proxy.addr);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                d.registry_mut().adapter_mut().restart_with(&args);
                Some(proxy)
            })
            .collect();
        for d in &drivers {
            d.registry().adapter().wait_ready();
        }
        let istiod_proxies: Vec<CutProxy> = drivers
            .iter()
            .map(|d| CutProxy::start(d.registry().adapter().grpc))
            .collect();
        let namespaces: Vec<String> = drivers.iter().map(|d| d.registry().namespace()).collect();
        apply(&mesh_kube, &sidecar_scope(&namespaces));
        let sources: Vec<SocketAddr> = istiod_proxies.iter().map(|p| p.addr).collect();
        let mesh = Mesh::start(&mesh_kube, &sources);
        let models = (0..drivers.len())
            .map(|i| Model::new(100 + i as u8))
            .collect();
        let report = Report {
            startup_secs: t.elapsed().as_secs_f64(),
            config: json!({
                "duration_secs": cfg.duration.as_secs_f64(), "rate": cfg.rate,
                "fault_every_secs": cfg.fault_every.as_secs_f64(), "seed": cfg.seed,
                "registries": names, "scheduled_faults": cfg.scheduled,
                "bound_secs": cfg.bound.as_secs_f64(), "break_truth": cfg.break_truth,
            }),
            ..Report::default()
        };
        eprintln!("soak: istiod and Envoy up; startup took {:?}", t.elapsed());
        World {
            rng: Rng::new(cfg.seed),
            cfg,
            names,
            drivers,
            models,
            registry_proxies,
            istiod_proxies,
            mesh,
            _mesh_kube: mesh_kube,
            turn: 0,
            report,
        }
    }

    /// The whole run: fill, warm-up quiet point, then drive and fault until the duration is
    /// over (and, in the short run, every kind of fault has come), then the final check.
    pub fn run(&mut self) {
        let wall = Instant::now();
        for i in 0..self.drivers.len() {
            while self.models[i].services.len() < SERVICES.0 {
                let kind = self.models[i].step(&mut self.rng, self.drivers[i].as_mut());
                self.report.op(&self.names[i], kind.name());
            }
        }
        self.quiet_point("warm-up", Instant::now());
        let able = |drivers: &[Box<dyn Driver>], proxies: &[Option<CutProxy>]| {
            let caps: Vec<(bool, bool)> = drivers
                .iter()
                .zip(proxies)
                .map(|(d, p)| (p.is_some(), d.registry().kind() != "file"))
                .collect();
            move |k: FaultKind, i: usize| match k {
                FaultKind::RegistryCut => caps[i].0,
                FaultKind::RegistryRestart => caps[i].1,
                _ => true,
            }
        };
        let mut schedule = Schedule::new(
            &self.names,
            able(&self.drivers, &self.registry_proxies),
            self.cfg.scheduled,
            self.cfg.fault_every,
        );
        let driving = Instant::now();
        while driving.elapsed() < self.cfg.duration || schedule.pending() {
            let gap = schedule.gap(&mut self.rng);
            self.drive(gap, None);
            let able_now = able(&self.drivers, &self.registry_proxies);
            let Some(fault) = schedule.next(&mut self.rng, self.drivers.len(), able_now) else {
                continue;
            };
            let healed = self.inject(fault);
            let target = fault.target.map_or("istiod", |i| self.names[i].as_str());
            let label = format!("{} ({target})", fault.kind.name());
            self.quiet_point(&label, healed);
        }
        self.quiet_point("final", Instant::now());
        self.hold_equal(Duration::from_secs(5));
        // 50% over the baseline plus 1 MiB. The baseline is the early sample whose population
        // is nearest the last one's; the short run measured 10-15 KiB per service (kube:
        // 787 KiB at 7 services, 854 KiB at 13), so even the full swing between 5 and 20
        // services is ~250 KiB, and the rest (connection pools, gRPC buffers) is what a
        // reconnect allocates again. A leak of 100 bytes per operation outgrows it in an hour
        // at 20 ops/s (12,000 operations per registry: 1.2 MB).
        self.report.check_heap(1.5, 1024.0 * 1024.0);
        self.report.wall_secs = wall.elapsed().as_secs_f64() + self.report.startup_secs;
    }

    /// Drives the registries for `dur` at the configured rate, round robin, skipping registry
    /// `skip`. Keeps the time driven in the report.
    fn drive(&mut self, dur: Duration, skip: Option<usize>) {
        let start = Instant::now();
        let end = start + dur;
        let interval = Duration::from_secs_f64(1.0 / self.cfg.rate.max(0.01));
        let mut next = start;
        while Instant::now() < end {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(end - now));
                continue;
            }
            // Behind by more than a second (a slow registry): no burst to catch up.
            next = if now - next > Duration::from_secs(1) {
                now + interval
            } else {
                next + interval
            };
            let i = self.turn % self.drivers.len();
            self.turn += 1;
            for (k, d) in self.drivers.iter_mut().enumerate() {
                if Some(k) != skip {
                    d.tick(&self.models[k]);
                }
            }
            if Some(i) == skip {
                continue;
            }
            let kind = self.models[i].step(&mut self.rng, self.drivers[i].as_mut());
            self.report.op(&self.names[i], kind.name());
        }
        self.report.driving_secs += start.elapsed().as_secs_f64();
    }

    /// Injects `fault`, driving on meanwhile; the instant it healed.
    fn inject(&mut self, fault: Fault) -> Instant {
        let target = fault
            .target
            .map_or("istiod".to_string(), |i| self.names[i].clone());
        eprintln!("soak: fault {} on {target}", fault.kind.name());
        self.report.fault(fault.kind.name(), &target);
        match (fault.kind, fault.target) {
            (FaultKind::AdapterKill, Some(i)) => {
                self.drivers[i].registry_mut().adapter_mut().kill();
                self.drive(OUTAGE, None);
                self.drivers[i].registry_mut().adapter_mut().restart();
            }
            (FaultKind::RegistryCut, Some(i)) => {
                if let Some(p) = &self.registry_proxies[i] {
                    p.cut();
                }
                self.drive(OUTAGE, None);
                if let Some(p) = &self.registry_proxies[i] {
                    p.heal();
                }
            }
            (FaultKind::IstiodCut, Some(i)) => {
                self.istiod_proxies[i].cut();
                self.drive(OUTAGE, None);
                self.istiod_proxies[i].heal();
            }
            (FaultKind::RegistryRestart, Some(i)) => {
                let t = Instant::now();
                self.drivers[i].restart_registry(&self.models[i]);
                eprintln!("soak: {target} restarted in {:?}", t.elapsed());
                // Changes after the restart must flow too: an adapter still waiting on the old
                // server's state would otherwise pass (a registry that comes back as it was
                // looks converged at once).
                self.drive(OUTAGE, None);
            }
            (FaultKind::IstiodRestart, _) => {
                self.mesh.istiod.kill();
                self.drive(OUTAGE, None);
                let t = Instant::now();
                self.mesh.istiod.restart();
                eprintln!("soak: istiod ready again in {:?}", t.elapsed());
            }
            (kind, None) => panic!("fault {kind:?} without a target"),
        }
        Instant::now()
    }

    /// Every registry's truth together; the driver's own account differing from it is noted.
    fn truth(&mut self) -> Result<Truth, String> {
        let mut all = Truth::new();
        for (i, d) in self.drivers.iter_mut().enumerate() {
            let t = d.truth().map_err(|e| format!("{}: {e}", self.names[i]))?;
            all.extend(t);
        }
        if self.cfg.break_truth {
            // The demonstration that a lost endpoint is seen: one endpoint dropped.
            if let Some(eps) = all.values_mut().find(|e| !e.is_empty()) {
                let first = eps.iter().next().cloned();
                if let Some(f) = first {
                    eps.remove(&f);
                }
            }
        }
        Ok(all)
    }

    /// With the driver paused: polls until istiod's and Envoy's views equal the registries'
    /// truth, for at most the bound from `since`; records the time or the divergence, then
    /// the adapters' heap and metric checks.
    fn quiet_point(&mut self, after: &str, since: Instant) {
        let namespaces: Vec<String> = self
            .drivers
            .iter()
            .map(|d| d.registry().namespace())
            .collect();
        let mut last = Vec::new();
        let converged = loop {
            let seen = self.truth().and_then(|truth| {
                let v = views(&self.mesh.istiod, &self.mesh.envoy, &namespaces)?;
                Ok(diff_all(&truth, &v))
            });
            match seen {
                Ok(d) if d.is_empty() => break Some(since.elapsed()),
                Ok(d) => last = d,
                Err(e) => last = vec![e],
            }
            if since.elapsed() > self.cfg.bound {
                break None;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let index = self.report.quiet.len();
        match converged {
            Some(t) => eprintln!("soak: quiet point {index} after {after}: converged in {t:?}"),
            None => eprintln!(
                "soak: quiet point {index} after {after}: DIVERGED (not equal {:?} after the heal):\n  {}",
                self.cfg.bound,
                last.join("\n  ")
            ),
        }
        self.report.quiet.push(Quiet {
            after: after.to_string(),
            converged,
            diff: if converged.is_some() {
                Vec::new()
            } else {
                last
            },
        });
        if converged.is_some() {
            self.check_registries(after);
        }
        self.check_adapters(index, after);
    }

    /// The driver's account against each registry's truth.
    fn check_registries(&mut self, after: &str) {
        for (i, d) in self.drivers.iter_mut().enumerate() {
            let expected = self.models[i].expected(d.registry());
            if let Ok(t) = d.truth() {
                let lines = super::compare::diff(&expected, &t, true);
                if !lines.is_empty() {
                    self.report.registry_mismatches.push(format!(
                        "{} after {after}: {}",
                        self.names[i],
                        lines.join("; ")
                    ));
                }
            }
        }
    }

    /// Per adapter: ready, its registry healthy, no NACK, nothing quarantined, no translation
    /// problem, and its registry error count still over 2 s; its heap recorded.
    fn check_adapters(&mut self, index: usize, after: &str) {
        let metrics = |a: &crate::Adapter| {
            crate::http_get(a.admin, "/metrics")
                .ok()
                .filter(|(s, _)| *s == 200)
                .map(|(_, body)| body)
        };
        let mut errors_before = Vec::new();
        for d in &self.drivers {
            let text = metrics(d.registry().adapter()).unwrap_or_default();
            errors_before.push(crate::metric_sum(
                &text,
                "mcp_adapter_registry_errors_total",
            ));
        }
        std::thread::sleep(Duration::from_secs(2));
        for (i, d) in self.drivers.iter().enumerate() {
            let a = d.registry().adapter();
            let name = &self.names[i];
            let Some(text) = metrics(a) else {
                self.report
                    .metric_failures
                    .push(format!("{name} after {after}: /metrics unreachable"));
                continue;
            };
            let m = |metric: &str| crate::metric_sum(&text, metric);
            let ready = crate::http_get(a.admin, "/readyz").is_ok_and(|(s, _)| s == 200);
            let checks = [
                (ready, "/readyz is not 200".to_string()),
                (
                    m("mcp_adapter_registry_healthy") == 1.0,
                    format!("registry_healthy {}", m("mcp_adapter_registry_healthy")),
                ),
                (
                    m("mcp_adapter_nacks_total") == 0.0,
                    format!("nacks_total {}", m("mcp_adapter_nacks_total")),
                ),
                (
                    m("mcp_adapter_quarantined_resources") == 0.0,
                    format!("quarantined {}", m("mcp_adapter_quarantined_resources")),
                ),
                (
                    m("mcp_adapter_registry_problems") == 0.0,
                    format!("registry_problems {}", m("mcp_adapter_registry_problems")),
                ),
                (
                    m("mcp_adapter_registry_errors_total") == errors_before[i],
                    format!(
                        "registry_errors_total grew while quiet: {} -> {}",
                        errors_before[i],
                        m("mcp_adapter_registry_errors_total")
                    ),
                ),
                (
                    name != "file" || m("mcp_adapter_registry_errors_total") == 0.0,
                    "the file adapter counted registry errors".to_string(),
                ),
            ];
            for (ok, what) in checks {
                if !ok {
                    self.report
                        .metric_failures
                        .push(format!("{name} after {after}: {what}"));
                }
            }
            self.report
                .heap
                .entry(name.clone())
                .or_default()
                .push(HeapSample {
                    quiet: index,
                    pid: a.pid().unwrap_or(0),
                    bytes: m("mcp_adapter_heap_bytes"),
                    services: self.models[i].services.len(),
                });
        }
    }

    /// The end state: equal at every look over `window` (nothing flaps back).
    fn hold_equal(&mut self, window: Duration) {
        let namespaces: Vec<String> = self
            .drivers
            .iter()
            .map(|d| d.registry().namespace())
            .collect();
        let end = Instant::now() + window;
        while Instant::now() < end {
            let seen = self.truth().and_then(|truth| {
                let v = views(&self.mesh.istiod, &self.mesh.envoy, &namespaces)?;
                Ok(diff_all(&truth, &v))
            });
            let lines = match seen {
                Ok(d) => d,
                Err(e) => vec![e],
            };
            if !lines.is_empty() {
                eprintln!("soak: the end state moved away:\n  {}", lines.join("\n  "));
                self.report.quiet.push(Quiet {
                    after: "final hold".into(),
                    converged: None,
                    diff: lines,
                });
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}
