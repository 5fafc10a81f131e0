//! Command-line and environment settings of adapter-consul.
//!
//! Credentials never come from a flag value (they would show in `ps` and shell history): the ACL
//! token is read from `CONSUL_HTTP_TOKEN` or from the file named by `--consul-token-file`.

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::parse;
use mcp_runtime::flags::{FilterFlags, ResponseFlags, TlsFlags};

/// Consul connection and selection settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ConsulConfig {
    /// Consul HTTP API address (`http://host:8500` or `https://host:8501`).
    #[arg(
        long = "consul-addr",
        env = "CONSUL_HTTP_ADDR",
        default_value = "http://127.0.0.1:8500"
    )]
    pub addr: String,

    /// File holding the ACL token (the token itself may also come from CONSUL_HTTP_TOKEN).
    #[arg(long = "consul-token-file", env = "CONSUL_HTTP_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// Datacenter to read (default: the agent's).
    #[arg(long = "consul-datacenter", env = "CONSUL_DATACENTER")]
    pub datacenter: Option<String>,

    /// Use HTTPS even when the address has no `https://` scheme (the consul CLI's
    /// `CONSUL_HTTP_SSL`; `true`/`false`, `1`/`0`, `t`/`f` as Go parses booleans).
    #[arg(long = "consul-http-ssl", env = "CONSUL_HTTP_SSL", value_parser = parse::go_bool)]
    pub ssl: Option<bool>,

    /// Verify Consul's HTTPS certificate (`CONSUL_HTTP_SSL_VERIFY=false` turns it off, as for
    /// the consul CLI; only for tests and emergencies: anyone on the path can then read the token).
    #[arg(
        long = "consul-http-ssl-verify",
        env = "CONSUL_HTTP_SSL_VERIFY",
        action = clap::ArgAction::Set,
        value_parser = parse::go_bool,
        default_value = "true"
    )]
    pub ssl_verify: bool,

    /// CA bundle and client certificate: `--consul-ca` (`CONSUL_CACERT`),
    /// `--consul-client-cert` (`CONSUL_CLIENT_CERT`), `--consul-client-key` (`CONSUL_CLIENT_KEY`),
    /// as the consul CLI names them.
    #[command(flatten)]
    pub tls: TlsFlags<ConsulTls>,

    /// `--max-response-size` (`MCP_MAX_RESPONSE_SIZE`): the largest answer read from Consul.
    #[command(flatten)]
    pub response: ResponseFlags,

    /// Directory of PEM CA certificates to verify Consul's HTTPS certificate (re-read when a
    /// file in it changes).
    #[arg(long = "consul-capath", env = "CONSUL_CAPATH")]
    pub capath: Option<PathBuf>,

    /// Server name to verify in Consul's certificate (when the address is an IP).
    #[arg(long = "consul-tls-server-name", env = "CONSUL_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,

    /// Consul Enterprise namespace (never sent unless set: open-source Consul rejects it).
    #[arg(long = "consul-namespace", env = "CONSUL_NAMESPACE")]
    pub consul_namespace: Option<String>,

    /// Consul Enterprise admin partition (never sent unless set).
    #[arg(long = "consul-partition", env = "CONSUL_PARTITION")]
    pub consul_partition: Option<String>,

    /// Also serve instances whose worst check is `warning` (default: all checks passing).
    #[arg(long, env = "MCP_CONSUL_INCLUDE_WARNING")]
    pub include_warning: bool,

    /// `--service` / `--exclude-service` (`MCP_CONSUL_SERVICES` / `MCP_CONSUL_EXCLUDE_SERVICES`).
    #[command(flatten)]
    pub services: FilterFlags<ConsulServices>,

    /// Only instances carrying all of these tags.
    #[arg(long = "tag", env = "MCP_CONSUL_TAGS", value_delimiter = ',')]
    pub tags: Vec<String>,

    /// Protocol of ports whose instances have no `protocol` meta (default: none, Istio sniffs).
    #[arg(long, env = "MCP_CONSUL_DEFAULT_PROTOCOL")]
    pub default_protocol: Option<String>,

    /// Hosts `<service>.service.<datacenter>.consul` instead of `<service>.<--host-suffix>`.
    #[arg(long, env = "MCP_CONSUL_HOST_DATACENTER")]
    pub host_datacenter: bool,

    /// Longest a blocking query waits for a change (Consul caps it at 10m).
    #[arg(long = "consul-wait", env = "MCP_CONSUL_WAIT", default_value = "5m", value_parser = parse::duration)]
    pub wait: Duration,

    /// Read from any Consul server (`?stale`), not only the leader: reads and blocking queries
    /// spread over the servers instead of all landing on the leader. Followers are usually
    /// within milliseconds of the leader; `--consul-max-stale` bounds it. `false` reads from
    /// the leader only (Consul's default mode).
    #[arg(
        long = "consul-stale",
        env = "MCP_CONSUL_STALE",
        action = clap::ArgAction::Set,
        value_parser = parse::go_bool,
        default_value = "true"
    )]
    pub stale: bool,

    /// With `--consul-stale`: a server that lost contact with the leader for longer than this
    /// passes the read on to the leader (Consul's `max_stale`). The staleness of each answer is
    /// the `mcp_adapter_registry_staleness_seconds` gauge.
    #[arg(long = "consul-max-stale", env = "MCP_CONSUL_MAX_STALE", default_value = "5s", value_parser = parse::duration)]
    pub max_stale: Duration,

    /// Most requests in flight to Consul besides the three change watches (clamped to
    /// 1..=128): the agent refuses more than `limits.http_max_conns_per_client` (default 200)
    /// connections from one address with HTTP 429, so the adapter never opens more than this
    /// plus three.
    #[arg(
        long = "consul-concurrency",
        env = "MCP_CONSUL_CONCURRENCY",
        default_value_t = 32
    )]
    pub concurrency: usize,

    /// Services that each hold their own blocking query on `/v1/health/service/<name>`: an
    /// instance added, removed or changed in one of them costs that one answer, with no sweep.
    /// Each is one connection, on top of `--consul-concurrency` + 3: the default keeps the
    /// total (99) at half the agent's `limits.http_max_conns_per_client` (200 from one address,
    /// shared with any other client there). Services beyond it are swept when the catalog
    /// changes in a way its list of services does not name. Raise Consul's limit with this one
    /// for large catalogs; 0 sweeps every service. When the agent refuses a connection
    /// anyway, watches are given up until all connections fit in three quarters of the limit
    /// met, until the next re-list.
    #[arg(
        long = "consul-service-watches",
        env = "MCP_CONSUL_SERVICE_WATCHES",
        default_value_t = 64
    )]
    pub service_watches: usize,
}

mcp_runtime::filter_names!(
    /// The names of adapter-consul's service filter.
    ConsulServices: "service" ("MCP_CONSUL_SERVICES") / "exclude-service" ("MCP_CONSUL_EXCLUDE_SERVICES"),
    "these services", "these services"
);

mcp_runtime::tls_names!(
    /// The names of adapter-consul's TLS files: the consul CLI's.
    ConsulTls: "Consul",
    ca "consul-ca" ("CONSUL_CACERT"),
    cert "consul-client-cert" ("CONSUL_CLIENT_CERT"),
    key "consul-client-key" ("CONSUL_CLIENT_KEY"),
);

/// Most requests in flight, whatever `--consul-concurrency` says.
pub const MAX_CONCURRENCY: usize = 128;

/// What `main` runs: these flags build a [`ConsulRegistry`](crate::registry::ConsulRegistry).
impl mcp_runtime::entry::AdapterConfig for ConsulConfig {
    type Registry = crate::registry::ConsulRegistry;
    type Error = crate::registry::ConfigError;
    const NAME: &'static str = env!("CARGO_PKG_NAME");
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const ABOUT: &'static str = "Serves Consul services as Istio ServiceEntries over MCP.";

    async fn registry(self) -> Result<Self::Registry, Self::Error> {
        crate::registry::ConsulRegistry::new(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;

    #[test]
    fn flags_are_consistent() {
        mcp_runtime::entry::command::<ConsulConfig>().debug_assert();
    }

    /// The boolean flags take Go's boolean values as the consul CLI's environment variables do
    /// (`--consul-http-ssl-verify false`), and default as documented.
    #[test]
    fn boolean_flags_take_a_value() {
        let parse = |args: &[&str]| {
            let m = mcp_runtime::entry::command::<ConsulConfig>()
                .try_get_matches_from(std::iter::once("adapter-consul").chain(args.iter().copied()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            ConsulConfig::from_arg_matches(&m).expect("config")
        };
        let c = parse(&[]);
        assert!(c.ssl_verify && c.stale && c.ssl.is_none());
        let c = parse(&[
            "--consul-http-ssl-verify",
            "false",
            "--consul-stale",
            "0",
            "--consul-http-ssl",
            "t",
        ]);
        assert!(!c.ssl_verify && !c.stale);
        assert_eq!(c.ssl, Some(true));
        let c = parse(&["--consul-http-ssl-verify", "1"]);
        assert!(c.ssl_verify);
    }
}
