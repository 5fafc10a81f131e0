//! Wires registry -> index -> cache -> servers, and runs until SIGTERM/SIGINT.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState};
use crate::cache::Snapshot;
use crate::cli::CommonArgs;
use crate::index::Index;
use crate::metrics::Metrics;
use crate::registry::{Registry, RegistryError, RegistryEvent};
use crate::server::{self, StreamContext, TlsFiles};
use crate::status::SharedStatus;
use crate::translate::TranslateConfig;

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
    /// Metrics could not be set up.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The gRPC server failed.
    #[error(transparent)]
    Server(#[from] server::ServerError),
    /// The admin server failed.
    #[error("admin server: {0}")]
    Admin(std::io::Error),
    /// A task panicked.
    #[error("task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// A running adapter (for tests and embedding): addresses, and a way to stop it.
#[derive(Debug)]
pub struct Running {
    /// Bound gRPC address.
    pub grpc_addr: SocketAddr,
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

    /// Waits until every task ends (after shutdown), returning the first error.
    pub async fn wait(&mut self) -> Result<(), RunError> {
        let mut result = Ok(());
        while let Some(r) = self.tasks.join_next().await {
            if let Err(e) = r.map_err(RunError::from).and_then(|r| r) {
                self.shutdown.cancel();
                if result.is_ok() {
                    result = Err(e);
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

/// Binds both ports and starts the registry watch, the gRPC server and the admin server.
pub async fn start<R: Registry>(registry: R, args: CommonArgs) -> Result<Running, RunError> {
    let metrics = Metrics::new(R::NAME)?;
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
    };
    let grpc = bind(args.listen).await?;
    let admin_listener = bind(args.admin_listen).await?;
    let grpc_addr = local(&grpc, args.listen);
    let admin_addr = local(&admin_listener, args.admin_listen);

    let shutdown = CancellationToken::new();
    let (snap_tx, snap_rx) = watch::channel(None);
    let status = SharedStatus::default();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;

    let mut tasks = JoinSet::new();
    let writer = Writer {
        index: Index::new(cfg, metrics.clone()),
        snapshots: snap_tx,
        status: status.clone(),
        metrics: metrics.clone(),
        coalesce: args.coalesce,
        health: health_reporter,
        shutdown: shutdown.clone(),
    };
    tasks.spawn(async move {
        writer.run(registry).await;
        Ok(())
    });
    let ctx = StreamContext {
        snapshots: snap_rx.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.tls_client_ca.clone(),
        }),
        _ => None,
    };
    let tls_on = tls.is_some();
    tasks.spawn(stop_all_on_exit(shutdown.clone(), async move {
        Ok(server::serve(grpc, ctx, health_service, tls).await?)
    }));
    let state = AdminState {
        registry: R::NAME,
        source,
        status,
        snapshots: snap_rx,
        metrics,
    };
    let admin_shutdown = shutdown.clone();
    tasks.spawn(stop_all_on_exit(shutdown.clone(), async move {
        admin::serve(admin_listener, state, admin_shutdown)
            .await
            .map_err(RunError::Admin)
    }));
    tracing::info!(registry = R::NAME, grpc = %grpc_addr, admin = %admin_addr, tls = tls_on, "Adapter started.");
    Ok(Running {
        grpc_addr,
        admin_addr,
        shutdown,
        tasks,
    })
}

/// When a server ends (error or not), everything stops.
async fn stop_all_on_exit(
    shutdown: CancellationToken,
    fut: impl Future<Output = Result<(), RunError>>,
) -> Result<(), RunError> {
    let r = fut.await;
    shutdown.cancel();
    r
}

/// Backoff between registry watch attempts: 100 ms doubling to 30 s.
#[derive(Debug)]
struct Backoff(Duration);

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(30);

    fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        d
    }

    fn reset(&mut self) {
        self.0 = Self::MIN;
    }
}

/// The single writer: owns the index and publishes snapshots.
struct Writer {
    index: Index,
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    status: SharedStatus,
    metrics: Metrics,
    coalesce: Duration,
    health: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
}

#[allow(clippy::large_enum_variant)] // one at a time, on the stack
enum Step {
    Event(RegistryEvent),
    Failed(RegistryError),
    Shutdown,
}

impl Writer {
    async fn run<R: Registry>(mut self, registry: R) {
        let mut backoff = Backoff(Backoff::MIN);
        loop {
            let mut stream = registry.watch();
            let error = loop {
                let first = self.next(&mut stream).await;
                let mut failure = None;
                match first {
                    Step::Shutdown => return,
                    Step::Failed(e) => break e,
                    Step::Event(ev) => {
                        if matches!(ev, RegistryEvent::Reset(_)) {
                            backoff.reset();
                            self.mark_healthy();
                        }
                        self.index.apply(ev);
                    }
                }
                // Collect what else arrives within the coalescing window into one push.
                if !self.coalesce.is_zero() {
                    let deadline = tokio::time::Instant::now() + self.coalesce;
                    loop {
                        let step = tokio::select! {
                            _ = tokio::time::sleep_until(deadline) => break,
                            step = self.next(&mut stream) => step,
                        };
                        match step {
                            Step::Shutdown => return,
                            Step::Failed(e) => {
                                failure = Some(e);
                                break;
                            }
                            Step::Event(ev) => {
                                if matches!(ev, RegistryEvent::Reset(_)) {
                                    self.mark_healthy();
                                }
                                self.index.apply(ev);
                            }
                        }
                    }
                }
                self.publish().await;
                if let Some(e) = failure {
                    break e;
                }
            };
            self.mark_unhealthy(&error);
            let delay = backoff.next();
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn next(
        &self,
        stream: &mut futures::stream::BoxStream<'static, Result<RegistryEvent, RegistryError>>,
    ) -> Step {
        tokio::select! {
            _ = self.shutdown.cancelled() => Step::Shutdown,
            item = stream.next() => match item {
                Some(Ok(ev)) => Step::Event(ev),
                Some(Err(e)) => Step::Failed(e),
                None => Step::Failed(RegistryError::Ended),
            }
        }
    }

    async fn publish(&mut self) {
        let first = self.snapshots.borrow().is_none();
        if !self.index.has_pending() && !first {
            self.update_debug();
            return;
        }
        if let Some(snapshot) = self.index.flush() {
            tracing::info!(
                version = %snapshot.version,
                resources = snapshot.entries.len(),
                "Publishing a new served set."
            );
            self.metrics
                .snapshots
                .with_label_values(&[if first { "initial" } else { "change" }])
                .inc();
            self.snapshots.send_replace(Some(snapshot));
            if first {
                self.status.lock().synced = true;
                self.health
                    .set_service_status("", tonic_health::ServingStatus::Serving)
                    .await;
                tracing::info!("First sync from the registry done; serving.");
            }
        }
        self.update_debug();
    }

    fn update_debug(&self) {
        let mut st = self.status.lock();
        st.quarantine = self.index.quarantine().to_vec();
        st.problems = self.index.problems().clone();
    }

    fn mark_healthy(&self) {
        let mut st = self.status.lock();
        if !st.healthy && st.last_error.is_some() {
            tracing::info!("Registry is back; in sync again.");
        }
        st.healthy = true;
        st.last_error = None;
        self.metrics.registry_healthy.set(1);
    }

    fn mark_unhealthy(&self, error: &RegistryError) {
        self.metrics
            .registry_errors
            .with_label_values(&[error.kind()])
            .inc();
        self.metrics.registry_healthy.set(0);
        let mut st = self.status.lock();
        if st.healthy || st.last_good.is_none() {
            st.last_good = Some(SystemTime::now());
        }
        st.healthy = false;
        st.last_error = Some(error.to_string());
        tracing::warn!(error = %error, serving_last_good = st.synced, "Registry watch failed; retrying with backoff.");
    }
}
