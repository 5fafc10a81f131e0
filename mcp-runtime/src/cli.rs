//! Flags every adapter shares. Each has an environment variable so container images can be
//! configured without rewriting the command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use mcp_core::filter::NameFilter;
use mcp_core::parse;
use mcp_core::shard::{Shard, ShardIndex};
use mcp_core::translate::{OnEmpty, DEFAULT_MAX_LABELS};
use mcp_core::vip::{VipCidr, VipError};
use mcp_server::tls::san::SanPattern;

mod output;
mod server;
pub use output::{Output, OutputArgs};
pub use server::ServerArgs;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Most shards one process serves (`--shards`): each is a port and a snapshot of its own.
pub const MAX_SHARDS: i64 = 64;

/// Flags shared by every adapter binary (`#[command(flatten)]` it into the adapter's args).
#[derive(Clone, Debug, clap::Args)]
pub struct CommonArgs {
    /// Address of the MCP gRPC server (MCP over xDS, legacy MCP, health, reflection).
    #[arg(long, env = "MCP_LISTEN", default_value = "127.0.0.1:15051")]
    pub listen: SocketAddr,

    /// Address of the admin HTTP server (/healthz, /readyz, /metrics, /debug/resources).
    #[arg(long, env = "MCP_ADMIN_LISTEN", default_value = "127.0.0.1:15052")]
    pub admin_listen: SocketAddr,

    /// Namespace of the generated ServiceEntries (default: the adapter's own, e.g. `consul`).
    #[arg(long, env = "MCP_NAMESPACE")]
    pub namespace: Option<String>,

    /// Suffix appended to registry service names to form hosts (default: the adapter's own,
    /// e.g. `service.consul`). An empty string appends nothing.
    #[arg(long, env = "MCP_HOST_SUFFIX")]
    pub host_suffix: Option<String>,

    /// Each host from the registry's own parts instead of name + --host-suffix, e.g.
    /// `{service}.shop.svc.cluster.local`: one host for one service served by two adapters
    /// during a move between registries. Parts: `{service}`, plus the registry's own (Nacos:
    /// `{group}`, `{namespace}`; Kubernetes: `{namespace}`); values are mapped to DNS labels.
    #[arg(long, env = "MCP_HOST_TEMPLATE")]
    pub host_template: Option<String>,

    /// Each ServiceEntry's name from `{name}` (the name it would get), `{registry}` and
    /// `{source}`, e.g. `{name}-{registry}`: two adapters writing one namespace need distinct
    /// names (istiod keeps the first source's entry of a name, wholly).
    #[arg(long, env = "MCP_NAME_TEMPLATE")]
    pub name_template: Option<String>,

    /// Name service port NUMBER NAME, and give it PROTOCOL if given (NUMBER=NAME[/PROTOCOL],
    /// repeatable or comma-separated), e.g. `8080=http/HTTP`: istiod merges two sources'
    /// endpoints of one host only under one port name.
    #[arg(long = "port-name", env = "MCP_PORT_NAMES", value_delimiter = ',')]
    pub port_names: Vec<String>,

    /// Label every endpoint with `mcp-adapter/registry` and `mcp-adapter/source` (as the
    /// ServiceEntry is), so that a DestinationRule can make subsets per registry.
    #[arg(long, env = "MCP_ENDPOINT_SOURCE_LABELS")]
    pub endpoint_source_labels: bool,

    /// Namespaces the ServiceEntries are exported to (comma-separated; empty = Istio's default).
    #[arg(long, env = "MCP_EXPORT_TO", value_delimiter = ',')]
    pub export_to: Vec<String>,

    /// Name of this source, put in the `mcp-adapter/source` label (default: the registry name).
    #[arg(long, env = "MCP_SOURCE_NAME")]
    pub source_name: Option<String>,

    /// Longest time changes are collected before one push (`20ms`, `1s`; `0` pushes at once).
    #[arg(long, env = "MCP_COALESCE", default_value = "20ms", value_parser = parse::duration)]
    pub coalesce: Duration,

    /// A service with no instances (all gone or unhealthy): `keep` its ServiceEntry with no
    /// endpoints, or `remove` it. Applies to services whose endpoints come from the registry
    /// (STATIC resolution); DNS and pass-through entries are served as they are.
    #[arg(long, env = "MCP_ON_EMPTY", value_parser = on_empty_values(), default_value = OnEmpty::Keep.as_str())]
    pub on_empty: OnEmpty,

    /// Range that virtual IPs come from, for TCP (or unknown-protocol) services the registry
    /// gives no address (they would share one wildcard listener per port in every sidecar);
    /// `off` to serve them without. Default: the adapter's own /16 in the reserved 242.0.0.0/8
    /// (clear of Istio's 240.240.0.0/16 auto-allocation). Clients need Istio's DNS proxying.
    /// With `--shard i/n` and no range given, shard i takes part i of the default (disjoint
    /// from the other shard processes'); a range given is used whole, as given.
    #[arg(long, env = "MCP_VIP_CIDR")]
    pub vip_cidr: Option<VipCidr>,

    /// How long a virtual IP a service stopped holding (it left, or moved) is kept from every
    /// other service, so a client that cached it never reaches another service there; a service
    /// waiting for such an address keeps its own meanwhile. `0` moves at once (replicas agree
    /// at every moment, but two colliding services can trade addresses).
    #[arg(long, env = "MCP_VIP_QUARANTINE", default_value = "5m", value_parser = parse::duration)]
    pub vip_quarantine: Duration,

    /// File that keeps the last served set: written at every change, served at startup until
    /// the registry answers (so a restart during a registry outage serves the last good state).
    #[arg(long, env = "MCP_STATE_FILE")]
    pub state_file: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "MCP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// PEM certificate chain: turns on TLS for the gRPC port (istiod <= 1.25 cannot use it).
    #[arg(long, env = "MCP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for `--tls-cert`.
    #[arg(long, env = "MCP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Serve only shard INDEX of COUNT (`0/4`): the services whose key hashes to it. Run one
    /// adapter per shard, each its own `configSources` entry (README: "Large registries").
    #[arg(long, env = "MCP_SHARD")]
    pub shard: Option<ShardIndex>,

    /// Serve the set as COUNT shards from this one process (one registry watch, one index):
    /// shard i on the `--listen` port + i, each its own `configSources` entry. A service is in
    /// the same shard as under `--shard i/COUNT`. 1: one source.
    #[arg(
        long,
        env = "MCP_SHARDS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=MAX_SHARDS),
        conflicts_with = "shard"
    )]
    pub shards: u16,

    /// Serve only services whose key (`namespace/name`, or the name; as /debug/resources shows
    /// it) matches one of these globs (comma-separated).
    #[arg(long, env = "MCP_SHARD_SERVICES", value_delimiter = ',')]
    pub shard_services: Vec<String>,

    /// Never serve services whose key matches one of these globs (comma-separated).
    #[arg(long, env = "MCP_SHARD_EXCLUDE_SERVICES", value_delimiter = ',')]
    pub shard_exclude_services: Vec<String>,

    /// Largest response the sinks accept (`4MiB` for Pilot 1.1-1.7 and istiod 1.8-1.11; istiod
    /// 1.12+ accepts 2 GiB). A larger response is not sent: the stream ends with
    /// RESOURCE_EXHAUSTED, an error is logged and counted. Default: no limit.
    #[arg(long, env = "MCP_MAX_MESSAGE_SIZE", value_parser = message_size)]
    pub max_message_size: Option<usize>,

    /// Most labels kept on one endpoint, and on one ServiceEntry (besides the adapter's own two):
    /// registry metadata (Consul tags and meta, Eureka metadata, Dubbo URL parameters, pod
    /// labels) becomes labels, and istiod holds and sends every one to every proxy. The first
    /// ones by key stay; what is cut is logged and counted
    /// (`mcp_adapter_translation_warnings_total{kind="label_limit"}`). Values are already held to
    /// Kubernetes' 63 characters (longer ones are dropped as invalid).
    #[arg(
        long,
        env = "MCP_MAX_LABELS",
        default_value_t = DEFAULT_MAX_LABELS,
        value_parser = label_count
    )]
    pub max_labels: usize,

    /// PEM CA bundle: sinks must present a client certificate signed by it.
    #[arg(long, env = "MCP_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Names a client certificate must carry (as a subject alternative name) besides being
    /// signed by `--tls-client-ca`, comma-separated: DNS names, URIs such as a SPIFFE ID
    /// `spiffe://cluster.local/ns/tools/sa/mcp-reader`, or a URI prefix ending in `/*`
    /// (`spiffe://cluster.local/ns/tools/*`). Other clients get PERMISSION_DENIED.
    /// Default: any certificate the CA signed.
    #[arg(
        long,
        env = "MCP_TLS_CLIENT_SAN",
        value_delimiter = ',',
        requires = "tls_client_ca",
        value_parser = SanPattern::parse
    )]
    pub tls_client_san: Vec<SanPattern>,

    /// How often the TLS files are looked at: a changed certificate, key or client CA bundle
    /// is used for new connections (open ones keep going), once it is checked usable.
    #[arg(long, env = "MCP_TLS_RELOAD_INTERVAL", default_value = "5s", value_parser = positive_duration)]
    pub tls_reload_interval: Duration,

    /// `--output` and the Kubernetes output's flags.
    #[command(flatten)]
    pub output: OutputArgs,

    /// The gRPC server's limits (`--max-streams`, `--max-connection-age`, ...).
    #[command(flatten)]
    pub server: ServerArgs,
}

impl CommonArgs {
    /// The services this adapter serves (`--shard*`).
    pub fn shard(&self) -> Shard {
        Shard {
            index: self.shard,
            names: NameFilter::new(
                self.shard_services.clone(),
                self.shard_exclude_services.clone(),
            ),
        }
    }

    /// The range virtual IPs come from: `--vip-cidr` as given; else `default`, or with
    /// `--shard i/n` part i of n of it, so separate shard processes never give two services
    /// one address (each allocates on its own).
    pub fn vip_range(&self, default: VipCidr) -> Result<VipCidr, VipError> {
        match (self.vip_cidr, self.shard) {
            (Some(given), _) => Ok(given),
            (None, Some(s)) => default.part(s.index, s.count),
            (None, None) => Ok(default),
        }
    }
}

/// `--max-labels`: a count above 0.
/// A duration above zero (a zero poll interval would spin).
/// `--on-empty`'s values and what each does, for `--help` (the policy itself is mcp-core's, which
/// knows no flags).
fn on_empty_values() -> impl clap::builder::TypedValueParser<Value = OnEmpty> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let help = |v: OnEmpty| {
        match v {
        OnEmpty::Keep => "Keep its ServiceEntry with no endpoints: the host stays known to the mesh, so clients get a fast \"no healthy upstream\" (503) instead of a DNS failure or a fall-through to passthrough, and routing rules that name it stay valid while it scales through zero",
        OnEmpty::Remove => "Remove its ServiceEntry until an instance is back",
    }
    };
    PossibleValuesParser::new(OnEmpty::ALL.map(|v| PossibleValue::new(v.as_str()).help(help(v))))
        // Only the values above get here.
        .map(|name| {
            OnEmpty::ALL
                .into_iter()
                .find(|v| v.as_str() == name)
                .unwrap_or_default()
        })
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match parse::duration(s)? {
        d if d.is_zero() => Err("must be above 0".into()),
        d => Ok(d),
    }
}

fn label_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid count {s:?}: a whole number above 0"))
}

/// `--max-message-size`: a byte count ([`parse::size`]) above 0 that fits in memory.
fn message_size(s: &str) -> Result<usize, String> {
    parse::size(s)?
        .try_into()
        .ok()
        .filter(|n: &usize| *n > 0)
        .ok_or_else(|| format!("invalid size {s:?}: must be above 0 and fit in memory"))
}

/// One flag group alone on a command line (`adapter ARGS`), as clap parses it, or clap's message
/// (for the flag groups' tests).
#[cfg(test)]
fn parse_group<T: clap::Args>(args: &[&str]) -> Result<T, String> {
    #[derive(clap::Parser)]
    struct Only<T: clap::Args> {
        #[command(flatten)]
        group: T,
    }
    <Only<T> as clap::Parser>::try_parse_from(
        std::iter::once("adapter").chain(args.iter().copied()),
    )
    .map(|a| a.group)
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_sizes() {
        assert_eq!(message_size("4MiB"), Ok(4 << 20));
        assert_eq!(message_size("100"), Ok(100));
        assert!(message_size("0").is_err());
        assert!(message_size("big").is_err());
    }

    fn parse(args: &[&str]) -> Result<CommonArgs, String> {
        parse_group(args)
    }

    #[test]
    fn on_empty_takes_each_spelling() {
        assert_eq!(parse(&[]).map(|a| a.on_empty), Ok(OnEmpty::Keep));
        for v in OnEmpty::ALL {
            assert_eq!(
                parse(&["--on-empty", v.as_str()]).map(|a| a.on_empty),
                Ok(v)
            );
        }
        let e = parse(&["--on-empty", "drop"]).expect_err("drop");
        assert!(
            e.contains("--on-empty") && e.contains("keep, remove"),
            "{e}"
        );
    }

    #[test]
    fn max_labels_is_a_count_above_zero() {
        assert_eq!(parse(&[]).map(|a| a.max_labels), Ok(DEFAULT_MAX_LABELS));
        assert_eq!(parse(&["--max-labels", "8"]).map(|a| a.max_labels), Ok(8));
        for bad in ["0", "-1", "many"] {
            let e = parse(&[&format!("--max-labels={bad}")]).expect_err(bad);
            assert!(e.contains("--max-labels"), "{e}");
        }
    }

    #[test]
    fn output_flags() {
        let a = parse(&[]).expect("defaults");
        assert_eq!(a.output.output, Output::Mcp);
        assert!(a.output.output.mcp() && !a.output.output.kube());
        assert_eq!((a.output.output_qps, a.output.output_burst), (50.0, 100));
        let a = parse(&["--output", "both", "--output-namespaces", "a,b"]).expect("both");
        assert!(a.output.output.mcp() && a.output.output.kube());
        assert_eq!(a.output.output_namespaces, ["a", "b"]);
        let a = parse(&["--output", "kube", "--output-resync", "30s"]).expect("kube");
        assert!(!a.output.output.mcp());
        assert_eq!(a.output.output_resync, Duration::from_secs(30));
        for bad in [
            &["--output", "crd"][..],
            &["--output-qps", "0"],
            &["--output-qps", "-1"],
            &["--output-burst", "0"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    /// #33 item 6: separate `--shard` processes take disjoint parts of the default range; a
    /// range given is used as given.
    #[test]
    fn shard_processes_split_the_default_vip_range_only() {
        let default = VipCidr::range(242, 1, 0, 0, 16);
        let range = |flags: &[&str]| parse(flags).map(|a| a.vip_range(default));
        assert_eq!(range(&[]), Ok(Ok(default)));
        assert_eq!(
            range(&["--shards", "4"]),
            Ok(Ok(default)),
            "one index for all"
        );
        assert_eq!(
            range(&["--shard", "1/2"]),
            Ok(Ok(VipCidr::range(242, 1, 128, 0, 17)))
        );
        assert_eq!(
            range(&["--shard", "1/2", "--vip-cidr", "10.9.0.0/24"]),
            Ok(Ok(VipCidr::range(10, 9, 0, 0, 24)))
        );
        let e = range(&["--shard", "0/20000"])
            .expect("parses")
            .expect_err("too small");
        assert!(e.to_string().contains("--vip-cidr"), "{e}");
    }

    #[test]
    fn shards_are_one_to_sixty_four_and_exclude_a_single_shard() {
        assert_eq!(parse(&[]).map(|a| a.shards), Ok(1));
        assert_eq!(parse(&["--shards", "8"]).map(|a| a.shards), Ok(8));
        for bad in ["0", "65", "x"] {
            let e = parse(&["--shards", bad]).expect_err(bad);
            assert!(e.contains("--shards"), "{e}");
        }
        let e = parse(&["--shards", "2", "--shard", "0/2"]).expect_err("both");
        assert!(e.contains("cannot be used with"), "{e}");
    }

    #[test]
    fn vip_quarantine_is_five_minutes_unless_given() {
        assert_eq!(
            parse(&[]).map(|a| a.vip_quarantine),
            Ok(mcp_core::vip::DEFAULT_QUARANTINE)
        );
        assert_eq!(
            parse(&["--vip-quarantine", "0"]).map(|a| a.vip_quarantine),
            Ok(Duration::ZERO)
        );
    }
}
