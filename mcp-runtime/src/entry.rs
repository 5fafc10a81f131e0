//! The whole `main` of every adapter binary: parse the shared flags and the adapter's own, build
//! its registry, run until SIGTERM. An adapter says what it is by implementing [`AdapterConfig`]
//! on its flags; its `main.rs` is then the allocator and one call to [`run`].

use std::future::Future;

use clap::{Args, CommandFactory, FromArgMatches};

use crate::cli::CommonArgs;
use crate::runtime::RunError;
use mcp_core::registry::Registry;

/// An adapter's own flags, and how its registry is built from them.
pub trait AdapterConfig: Args + Send + 'static {
    /// The registry these flags configure.
    type Registry: Registry;
    /// Why the registry could not be built (bad flags, unreadable credentials, ...).
    type Error: std::error::Error + Send + Sync + 'static;
    /// The binary's name (`env!("CARGO_PKG_NAME")` of the adapter's crate).
    const NAME: &'static str;
    /// Its version (`env!("CARGO_PKG_VERSION")` of the adapter's crate).
    const VERSION: &'static str;
    /// One line for `--help`: what it serves.
    const ABOUT: &'static str;
    /// The log filter when `RUST_LOG` is not set (a chatty client library may be quietened).
    const DEFAULT_LOG_FILTER: &'static str = "info";

    /// Builds the registry (checks the flags, reads credentials, connects if it must).
    fn registry(self) -> impl Future<Output = Result<Self::Registry, Self::Error>> + Send;
}

/// Why an adapter binary stopped (`E`: the adapter's own error building its registry).
#[derive(Debug, thiserror::Error)]
pub enum EntryError<E: std::error::Error + 'static> {
    /// The registry could not be built from the flags.
    #[error(transparent)]
    Registry(E),
    /// The async runtime could not start.
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The adapter ran and failed.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Both flag groups of an adapter binary.
#[derive(clap::Parser, Debug)]
struct Flags<C: Args> {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    adapter: C,
}

/// The command line of adapter `C`: the shared flags, its own, its name, version and about.
pub fn command<C: AdapterConfig>() -> clap::Command {
    Flags::<C>::command()
        .name(C::NAME)
        .bin_name(C::NAME)
        .version(C::VERSION)
        .about(C::ABOUT)
}

/// The adapters' runtime.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // A thread's last unmoved count goes to the shared sum when it ends: the blocking
        // pool's threads come and go (each idle 10 s), and each would take up to 16 KiB of
        // the live-heap count with it (`mcp_adapter_heap_bytes` drifting without bound).
        .on_thread_stop(crate::heap::flush_this_thread)
        .build()
}

/// Parses the command line (exiting with clap's message on bad flags, as `--help` and
/// `--version` do), builds the registry and runs the adapter until SIGTERM or SIGINT.
pub fn run<C: AdapterConfig>() -> Result<(), EntryError<C::Error>> {
    let cmd = command::<C>();
    let matches = cmd.clone().get_matches();
    let mut flags = Flags::<C>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    flags.common.output.config_fingerprint = crate::fingerprint::of(&cmd, &matches);
    flags.common.output.objects_fingerprint = crate::fingerprint::of_layout_free(&cmd, &matches);
    if std::env::var_os("RUST_LOG").is_none() && C::DEFAULT_LOG_FILTER != "info" {
        // Before any thread exists (the runtime's are started below).
        std::env::set_var("RUST_LOG", C::DEFAULT_LOG_FILTER);
    }
    runtime().map_err(EntryError::Runtime)?.block_on(async {
        let registry = flags
            .adapter
            .registry()
            .await
            .map_err(EntryError::Registry)?;
        crate::runtime::run(registry, flags.common).await?;
        Ok(())
    })
}
