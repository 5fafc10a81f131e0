//! Command-line and environment settings of adapter-zookeeper.
//!
//! The digest credentials never come from a flag value (they would show in `ps` and shell
//! history): they are read from `ZK_DIGEST` or from the file named by `--zk-digest-file`.

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::parse;
use mcp_runtime::flags::FilterFlags;

/// Which ZooKeeper layouts to read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Layout {
    /// Dubbo 2 interface level: `/dubbo/{interface}/providers/{URL}`.
    Dubbo,
    /// Curator x-discovery / Spring Cloud Zookeeper: `/services/{name}/{id}` JSON.
    Curator,
    /// Dubbo 3 application level: `/services/{app}/{ip:port}` Curator JSON with Dubbo metadata.
    Dubbo3,
    /// All three: each service directory is classified by what it holds.
    #[default]
    Auto,
}

/// Which registration of a Dubbo 3 provider to serve when it registers both at interface level
/// (`/dubbo/{interface}/providers`) and at application level (`/services/{application}`), as
/// Dubbo 3 does by default (`register-mode=all`). Serving both would give the same endpoints
/// twice under two hosts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DubboDiscovery {
    /// Interface level; an application is served only when no interface-level provider
    /// belongs to it (applications registered with `register-mode=instance`).
    #[default]
    Interface,
    /// Application level; interface-level providers of an application registered at
    /// application level are left out of their interface (Dubbo 2 providers stay).
    Application,
    /// Both, as registered.
    Both,
}

/// ZooKeeper connection and selection settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ZookeeperConfig {
    /// ZooKeeper ensemble: `host:port,host:port[/chroot]`.
    #[arg(long, env = "ZK_SERVERS", default_value = "127.0.0.1:2181")]
    pub zk_servers: String,

    /// Session timeout asked from the server (it clamps it to its min/max). A lost connection
    /// is ridden out this long (a leader election) before the registry is reported unreachable.
    #[arg(long, env = "ZK_SESSION_TIMEOUT", default_value = "10s", value_parser = parse::duration)]
    pub zk_session_timeout: Duration,

    /// File holding digest credentials `user:password` (may also come from ZK_DIGEST).
    #[arg(long, env = "ZK_DIGEST_FILE")]
    pub zk_digest_file: Option<PathBuf>,

    /// Layouts to read.
    #[arg(long, env = "MCP_ZK_LAYOUT", value_enum, default_value_t = Layout::Auto)]
    pub layout: Layout,

    /// Root paths to read (repeatable; default: `/dubbo` for dubbo, `/services` for curator and
    /// dubbo3, both for auto).
    #[arg(long = "root", env = "MCP_ZK_ROOTS", value_delimiter = ',')]
    pub roots: Vec<String>,

    /// Safety pass this often: one `exists` per watched znode, reading again only what changed
    /// since it was read (a lost watch). Watches are re-armed after every reconnect anyway, so
    /// this is a backstop, not how changes arrive.
    #[arg(long, env = "MCP_ZK_RESYNC_INTERVAL", default_value = "5m", value_parser = parse::duration)]
    pub resync_interval: Duration,

    /// Longest time one ZooKeeper request may take before the watch is restarted.
    #[arg(long, env = "MCP_ZK_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse::duration)]
    pub zk_request_timeout: Duration,

    /// How many znodes are read at once when listing.
    #[arg(long, env = "MCP_ZK_CONCURRENCY", default_value_t = 64)]
    pub zk_concurrency: usize,

    /// Which registration of a Dubbo 3 provider registered at both levels is served.
    #[arg(long, env = "MCP_ZK_DUBBO_DISCOVERY", value_enum, default_value_t = DubboDiscovery::Interface)]
    pub dubbo_discovery: DubboDiscovery,

    /// `--service` / `--exclude-service` (`MCP_ZK_SERVICES` / `MCP_ZK_EXCLUDE_SERVICES`):
    /// Dubbo interfaces, Curator/Spring services or Dubbo 3 applications.
    #[command(flatten)]
    pub services: FilterFlags<ZkServices>,

    /// `--dubbo-group` / `--exclude-dubbo-group` (`MCP_ZK_DUBBO_GROUPS` /
    /// `MCP_ZK_EXCLUDE_DUBBO_GROUPS`).
    #[command(flatten)]
    pub dubbo_groups: FilterFlags<DubboGroups>,

    /// `--dubbo-version` / `--exclude-dubbo-version` (`MCP_ZK_DUBBO_VERSIONS` /
    /// `MCP_ZK_EXCLUDE_DUBBO_VERSIONS`).
    #[command(flatten)]
    pub dubbo_versions: FilterFlags<DubboVersions>,
}

mcp_runtime::filter_names!(
    /// The names of adapter-zookeeper's service filter.
    ZkServices: "service" ("MCP_ZK_SERVICES") / "exclude-service" ("MCP_ZK_EXCLUDE_SERVICES"),
    "these services: Dubbo interfaces, Curator/Spring services or Dubbo 3 applications",
    "these services"
);

mcp_runtime::filter_names!(
    /// The names of the Dubbo group filter.
    DubboGroups: "dubbo-group" ("MCP_ZK_DUBBO_GROUPS") / "exclude-dubbo-group" ("MCP_ZK_EXCLUDE_DUBBO_GROUPS"),
    "Dubbo providers in these groups (a provider without a group has the empty group, which only `*` matches)",
    "Dubbo providers in these groups"
);

mcp_runtime::filter_names!(
    /// The names of the Dubbo version filter.
    DubboVersions: "dubbo-version" ("MCP_ZK_DUBBO_VERSIONS") / "exclude-dubbo-version" ("MCP_ZK_EXCLUDE_DUBBO_VERSIONS"),
    "Dubbo providers of these versions (no version is the empty one, matched by `*`)",
    "Dubbo providers of these versions"
);

impl ZookeeperConfig {
    /// The roots to read, with the layout of each (`None` = classify each directory).
    pub fn roots(&self) -> Vec<(String, Layout)> {
        let defaults: &[(&str, Layout)] = match self.layout {
            Layout::Dubbo => &[("/dubbo", Layout::Dubbo)],
            Layout::Curator => &[("/services", Layout::Curator)],
            Layout::Dubbo3 => &[("/services", Layout::Dubbo3)],
            Layout::Auto => &[("/dubbo", Layout::Auto), ("/services", Layout::Auto)],
        };
        let mut out: Vec<(String, Layout)> = if self.roots.is_empty() {
            defaults
                .iter()
                .map(|(r, l)| ((*r).to_string(), *l))
                .collect()
        } else {
            self.roots
                .iter()
                .map(|r| (normalize_root(r), self.layout))
                .collect()
        };
        out.sort();
        out.dedup_by(|a, b| a.0 == b.0);
        out
    }
}

/// `/x/` -> `/x`, `x` -> `/x`.
pub fn normalize_root(r: &str) -> String {
    let t = r.trim().trim_end_matches('/');
    if t.is_empty() {
        "/".to_string()
    } else if t.starts_with('/') {
        t.to_string()
    } else {
        format!("/{t}")
    }
}

/// What `main` runs: these flags build a [`ZookeeperRegistry`](crate::ZookeeperRegistry).
impl mcp_runtime::entry::AdapterConfig for ZookeeperConfig {
    type Registry = crate::ZookeeperRegistry;
    type Error = crate::registry::ConfigError;
    const NAME: &'static str = env!("CARGO_PKG_NAME");
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const ABOUT: &'static str = "Serves Dubbo and Curator/Spring Cloud services registered in ZooKeeper as Istio ServiceEntries over MCP.";
    // The ZooKeeper client logs every watch event at info: its warnings only, unless RUST_LOG
    // says otherwise.
    const DEFAULT_LOG_FILTER: &'static str = "info,zookeeper_async=warn";

    async fn registry(self) -> Result<Self::Registry, Self::Error> {
        crate::ZookeeperRegistry::new(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots() {
        assert_eq!(normalize_root("dubbo/"), "/dubbo");
        assert_eq!(normalize_root("/"), "/");
        let cfg = ZookeeperConfig {
            zk_servers: String::new(),
            zk_session_timeout: Duration::from_secs(10),
            zk_digest_file: None,
            layout: Layout::Auto,
            roots: vec![],
            resync_interval: Duration::from_secs(60),
            zk_request_timeout: Duration::from_secs(10),
            zk_concurrency: 8,
            dubbo_discovery: DubboDiscovery::Interface,
            services: Default::default(),
            dubbo_groups: Default::default(),
            dubbo_versions: Default::default(),
        };
        assert_eq!(
            cfg.roots(),
            vec![
                ("/dubbo".to_string(), Layout::Auto),
                ("/services".to_string(), Layout::Auto)
            ]
        );
        let dubbo = ZookeeperConfig {
            layout: Layout::Dubbo,
            roots: vec!["/a/".into(), "/a".into()],
            ..cfg
        };
        assert_eq!(dubbo.roots(), vec![("/a".to_string(), Layout::Dubbo)]);
    }

    #[test]
    fn flags_are_consistent() {
        mcp_runtime::entry::command::<ZookeeperConfig>().debug_assert();
    }
}
