//! Log setup for the adapter binaries.

use crate::cli::LogFormat;

/// Installs the global `tracing` subscriber (`RUST_LOG` filters, default `info`). Calling it twice
/// is harmless: the second call keeps the first subscriber.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
