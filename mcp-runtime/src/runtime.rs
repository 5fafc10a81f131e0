//! Wires registry -> index -> cache -> servers, and runs until SIGTERM/SIGINT.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState};
use crate::cli::CommonArgs;
use crate::status::SharedStatus;
use mcp_core::cache::state_file;
use mcp_core::index::Index;
use mcp_core::metrics::Metrics;
use mcp_core::registry::Registry;
use mcp_core::translate::TranslateConfig;
use mcp_kube_output::metrics::OutputMetrics;
use mcp_kube_output::SharedOutputStatus;
use mcp_server::metrics::ServerMetrics;
use mcp_server::sync_status::SyncBoard;
use mcp_server::tls::san::SanAllowList;
use mcp_server::tls::{Tls, TlsSettings};
use mcp_server::{self as server, StreamContext};

mod writer;
use writer::Writer;

/// Why the adapter could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `--shard` cannot take its part of the default `--vip-cidr`.
    #[error(transparent)]
    VipRange(#[from] mcp_core::vip::VipError),
    /// `--shards` asks for ports past 65535.
    #[error("--shards {shards} from --listen {listen}: shard ports would pass 65535")]
    ShardPorts {
        /// `--listen`.
        listen: SocketAddr,
        /// `--shards`.
        shards: usize,
    },
    /// `--admin-listen` is one of the shard ports.
    #[error("--admin-listen {admin} is one of the --shards {shards} gRPC ports from --listen {listen}: move it below them (e.g. port {below})")]
    AdminInShardPorts {
        /// `--admin-listen`.
        admin: SocketAddr,
        /// `--listen`.
        listen: SocketAddr,
        /// `--shards`.
        shards: usize,
        /// A port just below the shard ports.
        below: u16,
    },
    /// `--host-template`, `--name-template` or `--port-name` cannot work.
    #[error(transparent)]
    Naming(#[from] mcp_core::translate::template::TemplateError),
    /// Metrics could not be set up.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The gRPC server failed.
    #[error(transparent)]
    Server(#[from] server::ServerError),
    /// The TLS files are not usable.
    #[error("TLS setup: {0}")]
    Tls(#[from] server::tls::TlsError),
    /// The admin server failed.
    #[error("admin server: {0}")]
    Admin(std::io::Error),
    /// The Kubernetes output could not start.
    #[error(transparent)]
    Output(#[from] mcp_kube_output::OutputError),
    /// A task panicked.
    #[error("task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// gRPC health service name that reports the registry's health (`""`, the server's own status,
/// reports readiness like `/readyz`).
pub const REGISTRY_HEALTH: &str = "registry";

/// How long shutdown waits for streams and servers to finish before it closes them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A running adapter (for tests and embedding): addresses, and a way to stop it.
#[derive(Debug)]
pub struct Running {
    /// Bound gRPC address (of shard 0 with `--shards`; `--listen` unbound with `--output kube`).
    pub grpc_addr: SocketAddr,
    /// Every shard's bound gRPC address, in shard order (one without `--shards`, none with
    /// `--output kube`).
    pub grpc_addrs: Vec<SocketAddr>,
    /// Bound admin address.
    pub admin_addr: SocketAddr,
    /// Cancel to stop everything.
    pub shutdown: CancellationToken,
    tasks: JoinSet<Result<(), RunError>>,
}

impl Running {
    /// Stops and waits for every task.
    pub async fn stop(mut self) -> Result<(), RunError> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Waits until every task ends, returning the first error. Once shutdown has begun, the
    /// tasks get [`SHUTDOWN_GRACE`] to finish (streams end, in-flight responses drain); a sink
    /// that stopped reading cannot hold the process past it.
    pub async fn wait(&mut self) -> Result<(), RunError> {
        let mut result = Ok(());
        let shutdown = self.shutdown.clone();
        let grace = async move {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::pin!(grace);
        loop {
            tokio::select! {
                next = self.tasks.join_next() => {
                    let Some(r) = next else { break };
                    if let Err(e) = r.map_err(RunError::from).and_then(|r| r) {
                        tracing::error!(error = %e, "A task of the adapter failed; stopping.");
                        self.shutdown.cancel();
                        if result.is_ok() {
                            result = Err(e);
                        }
                    }
                }
                _ = &mut grace => {
                    tracing::warn!(
                        grace = ?SHUTDOWN_GRACE,
                        "Shutdown took too long (a sink stopped reading?); closing what is left."
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        result
    }
}

/// Runs an adapter until SIGTERM or SIGINT: the whole program of every adapter binary.
pub async fn run<R: Registry>(registry: R, args: CommonArgs) -> Result<(), RunError> {
    crate::telemetry::init_logging(args.log_format);
    let mut running = start(registry, args).await?;
    let shutdown = running.shutdown.clone();
    tokio::select! {
        _ = shutdown_signal() => {
            tracing::info!("Shutting down.");
            running.shutdown.cancel();
        }
        _ = shutdown.cancelled() => {}
    }
    running.wait().await
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, RunError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Bind { addr, source })
}

fn local(l: &tokio::net::TcpListener, fallback: SocketAddr) -> SocketAddr {
    l.local_addr().unwrap_or(fallback)
}

/// The gRPC listeners, one per shard: `listen`, then its port + 1, + 2, ... (each its own free
/// port when `listen`'s port is 0).
async fn bind_shards(
    listen: SocketAddr,
    shards: usize,
) -> Result<Vec<(tokio::net::TcpListener, SocketAddr)>, RunError> {
    let last = u16::try_from(shards.saturating_sub(1))
        .ok()
        .and_then(|n| listen.port().checked_add(n));
    if listen.port() != 0 && last.is_none() {
        return Err(RunError::ShardPorts { listen, shards });
    }
    let mut listeners = Vec::with_capacity(shards);
    for i in 0..shards {
        let mut addr = listen;
        if listen.port() != 0 {
            // In range: checked above.
            addr.set_port(listen.port() + i as u16);
        }
        let l = bind(addr).await?;
        let bound = local(&l, addr);
        listeners.push((l, bound));
    }
    Ok(listeners)
}

/// Binds both ports and starts the registry watch, the gRPC server and the admin server.
pub async fn start<R: Registry>(registry: R, args: CommonArgs) -> Result<Running, RunError> {
    let (metrics, server_metrics, output_metrics) = every_metric(R::NAME)?;
    for collector in registry.collectors() {
        metrics.register(collector)?;
    }
    if let Some(heap) = crate::heap::LiveHeap::when_counting()? {
        metrics.register(Box::new(heap))?;
    }
    let source = args
        .source_name
        .clone()
        .unwrap_or_else(|| R::NAME.to_string());
    let cfg = TranslateConfig {
        namespace: args
            .namespace
            .clone()
            .unwrap_or_else(|| R::DEFAULT_NAMESPACE.to_string()),
        host_suffix: args
            .host_suffix
            .clone()
            .unwrap_or_else(|| R::DEFAULT_HOST_SUFFIX.to_string()),
        export_to: args.export_to.clone(),
        registry: R::NAME.to_string(),
        source: source.clone(),
        on_empty: args.on_empty,
        vip_cidr: args.vip_range(R::DEFAULT_VIP_CIDR)?,
        max_labels: args.max_labels,
        naming: naming::<R>(&args)?,
    };
    if let (None, Some(shard)) = (args.vip_cidr, args.shard) {
        tracing::info!(%shard, vip_cidr = %cfg.vip_cidr, "--shard: virtual IPs come from this shard's part of the default --vip-cidr.");
    }
    let shards = usize::from(args.shards.max(1));
    let (listen, admin) = (args.listen, args.admin_listen);
    let mcp_on = args.output.output.mcp();
    if mcp_on
        && shards > 1
        && listen.port() != 0
        && (listen.port()..listen.port().saturating_add(shards as u16)).contains(&admin.port())
    {
        return Err(RunError::AdminInShardPorts {
            admin,
            listen,
            shards,
            below: listen.port().saturating_sub(1),
        });
    }
    // `--output kube`: no MCP port at all.
    let grpc = if mcp_on {
        bind_shards(args.listen, shards).await?
    } else {
        Vec::new()
    };
    let admin_listener = bind(args.admin_listen).await?;
    let grpc_addrs: Vec<SocketAddr> = grpc.iter().map(|(_, a)| *a).collect();
    let grpc_addr = grpc_addrs.first().copied().unwrap_or(args.listen);
    let admin_addr = local(&admin_listener, args.admin_listen);

    let shutdown = CancellationToken::new();
    let (snap_txs, snap_rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| watch::channel(None)).unzip();
    let (vips_tx, vips_rx) = watch::channel(Arc::<[mcp_core::vip::QuarantinedVip]>::from([]));
    let state_files: Vec<PathBuf> = args
        .state_file
        .iter()
        .flat_map(|p| (0..shards).map(|i| state_file::shard_path(p, i, shards)))
        .collect();
    let status = SharedStatus::default();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    health_reporter
        .set_service_status(REGISTRY_HEALTH, tonic_health::ServingStatus::NotServing)
        .await;

    let mut tasks = JoinSet::new();
    let writer = Writer {
        index: {
            let mut index = Index::with_shards(cfg, metrics.clone(), shards);
            index.set_vip_quarantine(args.vip_quarantine);
            index
        },
        snapshots: snap_txs,
        status: status.clone(),
        metrics: metrics.clone(),
        coalesce: args.coalesce,
        health: health_reporter,
        shutdown: shutdown.clone(),
        state_files: state_files.clone(),
        vip_quarantine: vips_tx,
        shard: args.shard(),
    };
    // The writer is the only task that moves the served set forward: if it dies (a panic),
    // the whole adapter stops with an error instead of serving a frozen set as if ready.
    tasks.spawn(stop_all_on_exit(shutdown.clone(), async move {
        writer.run(registry).await;
        Ok(())
    }));
    for (path, rx) in state_files.into_iter().zip(&snap_rxs) {
        let (rx, vips, stop) = (rx.clone(), vips_rx.clone(), shutdown.clone());
        tasks.spawn(async move {
            state_file::keep_saved(path, rx, vips, stop).await;
            Ok(())
        });
    }
    if args.output.output.kube() {
        let output_status = SharedOutputStatus::default();
        status.lock().output = Some(output_status.clone());
        output_metrics.kube_enabled.set(1);
        let parts = mcp_kube_output::OutputParts {
            registry: R::NAME,
            source: source.clone(),
            namespace: args
                .namespace
                .clone()
                .unwrap_or_else(|| R::DEFAULT_NAMESPACE.to_string()),
            only_shard: args.shard.map(|s| (s.index as usize, s.count as usize)),
            snapshots: snap_rxs.clone(),
            status: output_status,
            registry_synced: {
                let status = status.clone();
                Arc::new(move || status.lock().synced)
            },
            metrics: output_metrics,
            shutdown: shutdown.clone(),
        };
        let (elect, write) = mcp_kube_output::start(&args.output.config(), parts).await?;
        // The Lease task is supervised as the writer is: if it ends early (a panic), the adapter
        // stops rather than run an output that believes it leads (the writer also reads a
        // closed leadership channel as not leading).
        tasks.spawn(stop_all_on_exit(shutdown.clone(), async move {
            elect.await;
            Ok(())
        }));
        tasks.spawn(stop_all_on_exit(shutdown.clone(), async move {
            write.await;
            Ok(())
        }));
    }
    // No MCP port (`--output kube`): nothing to serve the certificate on, nothing to reload.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) if mcp_on => Some(Tls::start(
            TlsSettings {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
                client_sans: SanAllowList::new(args.tls_client_san.clone()),
                reload_every: args.tls_reload_interval,
            },
            server_metrics.clone(),
            shutdown.clone(),
        )?),
        _ => None,
    };
    let tls_on = tls.is_some();
    // One set of limits for every shard's port: they bound the process's memory.
    let limits = Arc::new(args.server.limits());
    let sync = SyncBoard::new(server_metrics.sink_subscriptions.clone());
    for (i, ((listener, _), rx)) in grpc.into_iter().zip(&snap_rxs).enumerate() {
        let ctx = StreamContext {
            snapshots: rx.clone(),
            metrics: server_metrics.clone(),
            shutdown: shutdown.clone(),
            max_message_size: args.max_message_size,
            shard: (shards > 1).then(|| i.to_string()),
            limits: limits.clone(),
            sync: sync.clone(),
        };
        let (health, tls) = (health_service.clone(), tls.clone());
        tasks.spawn(stop_all_on_exit(shutdown.clone(), async move {
            Ok(server::serve(listener, ctx, health, tls).await?)
        }));
    }
    let state = AdminState {
        registry: R::NAME,
        source,
        status,
        snapshots: snap_rxs,
        grpc_addrs: grpc_addrs.clone(),
        metrics,
        sync,
    };
    let admin_shutdown = shutdown.clone();
    tasks.spawn(stop_all_on_exit(shutdown.clone(), async move {
        admin::serve(admin_listener, state, admin_shutdown)
            .await
            .map_err(RunError::Admin)
    }));
    tracing::info!(registry = R::NAME, grpc = %grpc_addr, shards, admin = %admin_addr, tls = tls_on, "Adapter started.");
    Ok(Running {
        grpc_addr,
        grpc_addrs,
        admin_addr,
        shutdown,
        tasks,
    })
}

/// Every layer's metrics in one registry, whether the layer is on or not: `/metrics` always has
/// the same names.
fn every_metric(
    registry_name: &str,
) -> Result<(Metrics, ServerMetrics, OutputMetrics), prometheus::Error> {
    let metrics = Metrics::new(registry_name)?;
    let server = ServerMetrics::new(&metrics)?;
    let output = OutputMetrics::new(&metrics)?;
    Ok((metrics, server, output))
}

/// When a task ends (error, panic or not), everything stops: the guard cancels on unwinding too.
async fn stop_all_on_exit(
    shutdown: CancellationToken,
    fut: impl Future<Output = Result<(), RunError>>,
) -> Result<(), RunError> {
    let _stop_all = shutdown.drop_guard();
    fut.await
}

/// The naming flags, checked against what registry `R` has (a template that cannot work is
/// refused here, at start, naming the flag).
fn naming<R: Registry>(
    args: &CommonArgs,
) -> Result<mcp_core::translate::template::Naming, RunError> {
    use mcp_core::translate::template::{port_names, Naming, Template};
    let mut known = vec!["service"];
    known.extend(R::NAME_PARTS.iter().filter(|p| **p != "service"));
    Ok(Naming {
        host: args
            .host_template
            .as_deref()
            .map(|t| Template::host(t, &known))
            .transpose()?,
        name: args
            .name_template
            .as_deref()
            .map(Template::name)
            .transpose()?,
        port_names: port_names(&args.port_names)?,
        endpoint_source_labels: args.endpoint_source_labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry with Nacos' parts, for the naming flags.
    struct Parts;

    impl Registry for Parts {
        const NAME: &'static str = "parts";
        const DEFAULT_HOST_SUFFIX: &'static str = "";
        const DEFAULT_NAMESPACE: &'static str = "parts";
        const NAME_PARTS: &'static [&'static str] = &["service", "group"];

        fn watch(
            &self,
        ) -> futures::stream::BoxStream<
            'static,
            Result<mcp_core::registry::RegistryEvent, mcp_core::registry::RegistryError>,
        > {
            Box::pin(futures::stream::pending())
        }
    }

    #[test]
    fn naming_flags_that_cannot_work_are_refused_at_start_naming_the_flag() {
        let mut args = crate::testing::test_args();
        args.host_template = Some("{service}.{group}.mesh".into());
        args.name_template = Some("{name}-{source}".into());
        args.port_names = vec!["8080=http".into()];
        args.endpoint_source_labels = true;
        let n = naming::<Parts>(&args).expect("valid for a registry with groups");
        assert!(n.host.is_some() && n.name.is_some() && n.endpoint_source_labels);
        assert_eq!(
            n.port_names.get(&8080).map(|p| p.name.as_str()),
            Some("http")
        );
        let refused = |args: &CommonArgs| match naming::<mcp_core::testing::FakeRegistry>(args) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted: {args:?}"),
        };
        // The fake registry has no groups.
        assert!(
            refused(&args).contains("unknown part {group}; this registry has {service}"),
            "{}",
            refused(&args)
        );
        args.host_template = None;
        args.name_template = Some("{registry}".into());
        assert!(refused(&args).contains("--name-template \"{registry}\": needs {name}"));
        args.name_template = None;
        args.port_names = vec!["http".into()];
        assert!(refused(&args).contains("--port-name \"http\": expected NUMBER=NAME"));
    }

    #[test]
    fn every_metric_renders_with_the_registry_label() {
        let (core, m, k) = every_metric("consul").expect("metrics");
        m.pushes.with_label_values(&["xds", "serviceentry"]).inc();
        m.push_bytes.with_label_values(&["xds"]).inc();
        m.oversized.with_label_values(&["xds"]).inc();
        m.acks.with_label_values(&["xds", "serviceentry"]).inc();
        m.nacks.with_label_values(&["xds", "serviceentry"]).inc();
        m.sinks.with_label_values(&["xds"]).inc();
        m.refused_streams.with_label_values(&["streams"]).inc();
        m.unacked.with_label_values(&["xds"]).inc();
        core.translation_warnings
            .with_label_values(&["label"])
            .inc();
        core.registry_errors
            .with_label_values(&["unavailable"])
            .inc();
        core.registry_retries
            .with_label_values(&["unavailable"])
            .inc();
        core.snapshots.with_label_values(&["change"]).inc();
        core.shard_resources.with_label_values(&["0"]).set(1);
        core.shard_snapshots.with_label_values(&["0"]).inc();
        m.shard_sinks.with_label_values(&["0"]).inc();
        m.shard_push_bytes.with_label_values(&["0"]).inc();
        k.kube_requests.with_label_values(&["apply", "200"]).inc();
        m.tls_refused.with_label_values(&["handshake"]).inc();
        m.tls_reloads.with_label_values(&["ok"]).inc();
        m.refused_connections
            .with_label_values(&["connections"])
            .inc();
        m.connections.with_label_values(&["served"]).inc();
        let text = core.render();
        for name in [
            "mcp_adapter_pushes_total",
            "mcp_adapter_push_bytes_total",
            "mcp_adapter_oversized_responses_total",
            "mcp_adapter_acks_total",
            "mcp_adapter_nacks_total",
            "mcp_adapter_connected_sinks",
            "mcp_adapter_refused_streams_total",
            "mcp_adapter_unacked_responses",
            "mcp_adapter_resources",
            "mcp_adapter_quarantined_resources",
            "mcp_adapter_translation_warnings_total",
            "mcp_adapter_registry_errors_total",
            "mcp_adapter_registry_retries_total",
            "mcp_adapter_registry_healthy",
            "mcp_adapter_last_good_sync_age_seconds",
            "mcp_adapter_registry_problems",
            "mcp_adapter_snapshots_total",
            "mcp_adapter_shard_resources",
            "mcp_adapter_shard_snapshots_total",
            "mcp_adapter_shard_connected_sinks",
            "mcp_adapter_shard_push_bytes_total",
            "mcp_adapter_tls_refused_connections_total",
            "mcp_adapter_tls_reloads_total",
            "mcp_adapter_tls_reload_failing",
            "mcp_adapter_tls_certificate_not_after_seconds",
            "mcp_adapter_refused_connections_total",
            "mcp_adapter_connections",
            "mcp_adapter_kube_output_requests_total",
            "mcp_adapter_kube_output_pending",
            "mcp_adapter_kube_output_lag_seconds",
            "mcp_adapter_kube_output_leader",
            "mcp_adapter_kube_output_objects",
            "mcp_adapter_kube_output_conflicts",
            "mcp_adapter_kube_output_rejected",
            "mcp_adapter_kube_output_owner_conflicts",
        ] {
            assert!(
                text.contains(&format!("{name}{{")),
                "{name} missing:\n{text}"
            );
        }
        assert!(text.contains("registry=\"consul\""));
    }
}
