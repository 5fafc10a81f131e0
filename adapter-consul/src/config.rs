//! Command-line and environment settings of adapter-consul.
//!
//! Credentials never come from a flag value (they would show in `ps` and shell history): the ACL
//! token is read from `CONSUL_HTTP_TOKEN` or from the file named by `--consul-token-file`.

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::cli::parse_duration;

/// What to do with a service whose instances are all unhealthy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnEmpty {
    /// Keep the ServiceEntry with no endpoints: the host stays known to the mesh and requests
    /// fail fast with "no healthy upstream" instead of leaking out of the mesh, and istiod does an
    /// endpoint-only push rather than a full one when instances come back.
    #[default]
    Keep,
    /// Delete the ServiceEntry.
    Delete,
}

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

    /// CA bundle to verify Consul's HTTPS certificate.
    #[arg(long = "consul-ca", env = "CONSUL_CACERT")]
    pub ca: Option<PathBuf>,

    /// Client certificate for Consul (`verify_incoming`).
    #[arg(
        long = "consul-client-cert",
        env = "CONSUL_CLIENT_CERT",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,

    /// Key of the client certificate.
    #[arg(
        long = "consul-client-key",
        env = "CONSUL_CLIENT_KEY",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,

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

    /// A service whose instances are all unhealthy: keep it with no endpoints, or delete it.
    #[arg(long, env = "MCP_CONSUL_ON_EMPTY", value_enum, default_value_t = OnEmpty::Keep)]
    pub on_empty: OnEmpty,

    /// Only these services (names or globs with `*` and `?`; comma-separated or repeated).
    #[arg(long = "service", env = "MCP_CONSUL_SERVICES", value_delimiter = ',')]
    pub services: Vec<String>,

    /// Never these services (names or globs).
    #[arg(
        long = "exclude-service",
        env = "MCP_CONSUL_EXCLUDE_SERVICES",
        value_delimiter = ','
    )]
    pub exclude_services: Vec<String>,

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
    #[arg(long = "consul-wait", env = "MCP_CONSUL_WAIT", default_value = "5m", value_parser = parse_duration)]
    pub wait: Duration,

    /// How many services are fetched at once when (re)listing.
    #[arg(
        long = "consul-concurrency",
        env = "MCP_CONSUL_CONCURRENCY",
        default_value_t = 32
    )]
    pub concurrency: usize,
}
