//! Log setup for the adapter binaries, and how an error is written into a log line or a status.

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

/// An error and every `source()` below it, joined by `: ` (what `{:#}` prints for anyhow): the
/// cause that says what to fix is usually the innermost one (a refused connection under a
/// "transport error").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let text = inner.to_string();
        // Some errors repeat their source in their own message; say it once.
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = inner.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chains() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("transport error")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(error_chain(&e), "transport error: connection refused");
    }
}
