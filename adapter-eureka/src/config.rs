//! Command-line and environment settings of adapter-eureka.
//!
//! Credentials never come from a flag value (they would show in `ps` and shell history): the
//! basic-auth user and password come from `EUREKA_USERNAME`/`EUREKA_PASSWORD` or from the file
//! named by `--eureka-auth-file`; a URL with `user:password@` in it is refused.

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::parse;
use mcp_runtime::flags::{FilterFlags, ResponseFlags, TlsFlags};

/// Eureka connection and selection settings.
#[derive(Clone, Debug, clap::Args)]
pub struct EurekaConfig {
    /// Eureka base URL including its path (`http://host:8761/eureka` for Spring Cloud,
    /// `http://host:8080/eureka/v2` for the Netflix war). Repeat (or comma-separate) for
    /// failover, in order of preference, like Eureka's `defaultZone` list.
    #[arg(
        long = "eureka-url",
        env = "EUREKA_URL",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8761/eureka"
    )]
    pub urls: Vec<String>,

    /// How often `/apps/delta` is polled (at least 1s).
    #[arg(long, env = "MCP_EUREKA_REFRESH_INTERVAL", default_value = "5s", value_parser = parse::duration)]
    pub refresh_interval: Duration,

    /// Longest one request to Eureka may take.
    #[arg(long = "eureka-timeout", env = "MCP_EUREKA_TIMEOUT", default_value = "10s", value_parser = parse::duration)]
    pub timeout: Duration,

    /// How long a fallback server is used before the first (preferred) URL is tried again.
    #[arg(long, env = "MCP_EUREKA_FAILBACK_AFTER", default_value = "60s", value_parser = parse::duration)]
    pub failback_after: Duration,

    /// After a server switch or a server restart, a registry that shrank to nothing is not
    /// served for this long (Eureka servers start empty and fill as clients re-register).
    #[arg(long, env = "MCP_EUREKA_STARTUP_GRACE", default_value = "60s", value_parser = parse::duration)]
    pub startup_grace: Duration,

    /// File holding `user:password` for basic auth (or set EUREKA_USERNAME and EUREKA_PASSWORD).
    #[arg(long = "eureka-auth-file", env = "EUREKA_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,

    /// `--eureka-ca`, `--eureka-client-cert`, `--eureka-client-key` (`EUREKA_CA`,
    /// `EUREKA_CLIENT_CERT`, `EUREKA_CLIENT_KEY`).
    #[command(flatten)]
    pub tls: TlsFlags<EurekaTls>,

    /// `--max-response-size` (`MCP_MAX_RESPONSE_SIZE`): the largest `/apps` or delta read.
    #[command(flatten)]
    pub response: ResponseFlags,

    /// `--app` / `--exclude-app` (`MCP_EUREKA_APPS` / `MCP_EUREKA_EXCLUDE_APPS`), matched
    /// case-insensitively.
    #[command(flatten)]
    pub apps: FilterFlags<EurekaApps>,
}

mcp_runtime::filter_names!(
    /// The names of adapter-eureka's app filter.
    EurekaApps: "app" ("MCP_EUREKA_APPS") / "exclude-app" ("MCP_EUREKA_EXCLUDE_APPS"),
    "these apps (case-insensitive)", "these apps (case-insensitive)"
);

mcp_runtime::tls_names!(
    /// The names of adapter-eureka's TLS files.
    EurekaTls: "Eureka",
    ca "eureka-ca" ("EUREKA_CA"),
    cert "eureka-client-cert" ("EUREKA_CLIENT_CERT"),
    key "eureka-client-key" ("EUREKA_CLIENT_KEY"),
);

/// Shortest refresh interval: Eureka answers deltas from a cache, polling faster buys nothing.
pub const MIN_REFRESH: Duration = Duration::from_secs(1);

impl EurekaConfig {
    /// The refresh interval, raised to [`MIN_REFRESH`].
    pub fn refresh(&self) -> Duration {
        self.refresh_interval.max(MIN_REFRESH)
    }

    /// The app filter; globs are matched against lower-cased app names (Eureka upper-cases
    /// them, people write them either way).
    pub fn filter(&self) -> mcp_core::filter::NameFilter {
        let lower = |v: &[String]| v.iter().map(|s| s.to_lowercase()).collect();
        mcp_core::filter::NameFilter::new(lower(&self.apps.allow), lower(&self.apps.deny))
    }
}

/// What `main` runs: these flags build a [`EurekaRegistry`](crate::registry::EurekaRegistry).
impl mcp_runtime::entry::AdapterConfig for EurekaConfig {
    type Registry = crate::registry::EurekaRegistry;
    type Error = crate::registry::SetupError;
    const NAME: &'static str = env!("CARGO_PKG_NAME");
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const ABOUT: &'static str = "Serves Eureka applications as Istio ServiceEntries over MCP.";

    async fn registry(self) -> Result<Self::Registry, Self::Error> {
        crate::registry::EurekaRegistry::new(&self)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        eureka: EurekaConfig,
    }

    /// The config these flags give (for the crate's tests).
    pub(crate) fn parse(args: &[&str]) -> EurekaConfig {
        Args::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .expect("parse")
            .eureka
    }

    #[test]
    fn urls_filters_and_refresh_floor() {
        let a = parse(&[
            "--eureka-url",
            "http://a:8761/eureka,http://b:8761/eureka",
            "--app",
            "Orders*",
            "--exclude-app",
            "*-CANARY",
            "--refresh-interval",
            "100ms",
        ]);
        assert_eq!(a.urls.len(), 2);
        assert_eq!(a.refresh(), MIN_REFRESH);
        let f = a.filter();
        assert!(f.allows("orders-api"));
        assert!(!f.allows("orders-canary"));
        assert!(!f.allows("payments"));
    }

    #[test]
    fn flags_are_consistent() {
        mcp_runtime::entry::command::<EurekaConfig>().debug_assert();
    }
}
