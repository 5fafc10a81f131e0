//! Command-line and environment settings of adapter-nacos.
//!
//! Credentials never come from a flag value (they would show in `ps` and shell history): the
//! user and password come from `NACOS_USERNAME`/`NACOS_PASSWORD` or from the file named by
//! `--nacos-auth-file` (one line `user:password`, re-read when it changes, so a mounted Secret
//! can rotate).

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::parse;
use mcp_runtime::flags::{FilterFlags, ResponseFlags, TlsFlags};

/// Nacos connection and selection settings.
#[derive(Clone, Debug, clap::Args)]
pub struct NacosConfig {
    /// Nacos server address: `host:port` of its HTTP port, or `http://host:port` /
    /// `https://host:port` (TLS on both the HTTP and the gRPC port). Repeat (or comma-separate)
    /// for a cluster: the first that answers is used, the next on failure.
    #[arg(
        long = "nacos-addr",
        env = "NACOS_ADDR",
        value_delimiter = ',',
        default_value = "127.0.0.1:8848"
    )]
    pub addrs: Vec<String>,

    /// The gRPC port's distance from the HTTP port (Nacos 2.x clients assume 1000).
    #[arg(long, env = "MCP_NACOS_GRPC_PORT_OFFSET", default_value_t = 1000)]
    pub grpc_port_offset: u16,

    /// Nacos namespace ids to watch (`public` or the empty id is the default namespace);
    /// repeat or comma-separate. None: every namespace the server lists, found again at each
    /// service-list read (Nacos lists only namespaces created as such: one that exists only
    /// because an instance was registered in it must be named here); `public` alone where the
    /// server lists no namespaces to this client (Nacos 3 without a user allowed its admin API).
    #[arg(
        long = "nacos-namespace",
        env = "MCP_NACOS_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,

    /// How often each namespace's service names are read (new services are subscribed to,
    /// removed ones dropped). Instances are never polled: the server pushes them.
    #[arg(long, env = "MCP_NACOS_SERVICE_LIST_INTERVAL", default_value = "5s", value_parser = parse::duration)]
    pub service_list_interval: Duration,

    /// Longest one request to Nacos may take.
    #[arg(long = "nacos-timeout", env = "MCP_NACOS_TIMEOUT", default_value = "10s", value_parser = parse::duration)]
    pub timeout: Duration,

    /// After a reconnect, a registry that came back with no instance at all where some were
    /// served is not believed for this long: a restarted Nacos has lost its ephemeral
    /// instances until their clients register them again (Nacos 2.x clients redo that within
    /// seconds of reconnecting).
    #[arg(long, env = "MCP_NACOS_STARTUP_GRACE", default_value = "30s", value_parser = parse::duration)]
    pub startup_grace: Duration,

    /// File holding `user:password` for Nacos' auth (or set NACOS_USERNAME and NACOS_PASSWORD).
    /// The adapter logs in and renews the access token before it expires.
    #[arg(long = "nacos-auth-file", env = "NACOS_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,

    /// Also serve Dubbo's `consumers:*` services (a consumer's own registration, port 0: never
    /// a destination, left out by default as Higress does).
    #[arg(long, env = "MCP_NACOS_DUBBO_CONSUMERS")]
    pub dubbo_consumers: bool,

    /// `--nacos-ca`, `--nacos-client-cert`, `--nacos-client-key` (`NACOS_CA`,
    /// `NACOS_CLIENT_CERT`, `NACOS_CLIENT_KEY`).
    #[command(flatten)]
    pub tls: TlsFlags<NacosTls>,

    /// `--max-response-size` (`MCP_MAX_RESPONSE_SIZE`): the largest HTTP answer read.
    #[command(flatten)]
    pub response: ResponseFlags,

    /// `--group` / `--exclude-group` (`MCP_NACOS_GROUPS` / `MCP_NACOS_EXCLUDE_GROUPS`).
    #[command(flatten)]
    pub groups: FilterFlags<NacosGroups>,

    /// `--service` / `--exclude-service` (`MCP_NACOS_SERVICES` / `MCP_NACOS_EXCLUDE_SERVICES`).
    #[command(flatten)]
    pub services: FilterFlags<NacosServices>,
}

mcp_runtime::filter_names!(
    /// The names of adapter-nacos' group filter.
    NacosGroups: "group" ("MCP_NACOS_GROUPS") / "exclude-group" ("MCP_NACOS_EXCLUDE_GROUPS"),
    "these Nacos groups", "these Nacos groups"
);

mcp_runtime::filter_names!(
    /// The names of adapter-nacos' service filter.
    NacosServices: "service" ("MCP_NACOS_SERVICES") / "exclude-service" ("MCP_NACOS_EXCLUDE_SERVICES"),
    "these Nacos services (by service name)", "these Nacos services (by service name)"
);

mcp_runtime::tls_names!(
    /// The names of adapter-nacos' TLS files.
    NacosTls: "Nacos",
    ca "nacos-ca" ("NACOS_CA"),
    cert "nacos-client-cert" ("NACOS_CLIENT_CERT"),
    key "nacos-client-key" ("NACOS_CLIENT_KEY"),
);

/// Shortest service-list interval: each read is one request per namespace.
pub const MIN_SERVICE_LIST_INTERVAL: Duration = Duration::from_millis(500);

impl NacosConfig {
    /// The service-list interval, raised to [`MIN_SERVICE_LIST_INTERVAL`].
    pub fn service_list(&self) -> Duration {
        self.service_list_interval.max(MIN_SERVICE_LIST_INTERVAL)
    }

    /// The namespace ids to watch (the empty id written `public`, as Nacos' clients send it),
    /// none for all.
    pub fn namespace_ids(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .namespaces
            .iter()
            .map(|n| crate::dto::namespace_id(n))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// What `main` runs: these flags build a [`NacosRegistry`](crate::registry::NacosRegistry).
impl mcp_runtime::entry::AdapterConfig for NacosConfig {
    type Registry = crate::registry::NacosRegistry;
    type Error = crate::registry::SetupError;
    const NAME: &'static str = env!("CARGO_PKG_NAME");
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const ABOUT: &'static str = "Serves Nacos services as Istio ServiceEntries over MCP.";

    async fn registry(self) -> Result<Self::Registry, Self::Error> {
        crate::registry::NacosRegistry::new(&self)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        nacos: NacosConfig,
    }

    /// The config these flags give (for the crate's tests).
    pub(crate) fn parse(args: &[&str]) -> NacosConfig {
        Args::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .expect("parse")
            .nacos
    }

    #[test]
    fn addresses_namespaces_filters_and_floor() {
        let c = parse(&[
            "--nacos-addr",
            "10.0.0.1:8848,https://nacos-2:8848",
            "--nacos-namespace",
            "public,dev,dev",
            "--group",
            "DEFAULT_GROUP",
            "--exclude-service",
            "*-canary",
            "--service-list-interval",
            "10ms",
        ]);
        assert_eq!(c.addrs.len(), 2);
        assert_eq!(
            c.namespace_ids(),
            vec!["dev".to_string(), "public".to_string()]
        );
        assert_eq!(
            parse(&["--nacos-namespace", ",public"]).namespace_ids(),
            ["public"]
        );
        assert_eq!(c.service_list(), MIN_SERVICE_LIST_INTERVAL);
        assert!(c.groups.filter().allows("DEFAULT_GROUP"));
        assert!(!c.groups.filter().allows("OTHER"));
        assert!(!c.services.filter().allows("orders-canary"));
        assert!(c.services.filter().allows("orders"));
        assert!(parse(&[]).namespace_ids().is_empty());
    }

    #[test]
    fn flags_are_consistent() {
        mcp_runtime::entry::command::<NacosConfig>().debug_assert();
    }
}
