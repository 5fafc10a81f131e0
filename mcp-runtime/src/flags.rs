//! Flag groups that several adapters declare, each under names of its own: an allow/deny
//! filter (`--service`/`--exclude-service` for Consul and ZooKeeper, `--app`/`--exclude-app`
//! for Eureka, ...) and the TLS files of a registry client (`--consul-ca`, `--eureka-ca`, ...);
//! and one under the same name wherever it is: [`ResponseFlags`], the body cap of the adapters
//! that read their registry over HTTP (Consul, Eureka).
//!
//! The meaning, the parsing and the help text are written once here; an adapter names its
//! flags by implementing [`FilterNames`] or [`TlsNames`] on a marker type and flattens
//! [`FilterFlags`] / [`TlsFlags`] into its `clap::Args` struct.

use std::marker::PhantomData;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

use crate::http_client::HttpSettings;
use mcp_core::filter::NameFilter;
use mcp_core::parse;

/// The names of one allow/deny filter pair.
pub trait FilterNames: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The allow-list flag (`service`).
    const ALLOW: &'static str;
    /// Its environment variable (`MCP_CONSUL_SERVICES`).
    const ALLOW_ENV: &'static str;
    /// The deny-list flag (`exclude-service`).
    const DENY: &'static str;
    /// Its environment variable (`MCP_CONSUL_EXCLUDE_SERVICES`).
    const DENY_ENV: &'static str;
    /// What the allow list selects, for `--help` (`these services`).
    const ALLOW_HELP: &'static str;
    /// What the deny list removes, for `--help` (`these services`).
    const DENY_HELP: &'static str;
}

/// Declares a marker type `$name` that names a [`FilterFlags`] pair: its allow flag and
/// variable, its deny flag and variable, and what each selects for `--help`.
///
/// ```
/// mcp_runtime::filter_names!(
///     /// The names of the app filter.
///     Apps: "app" ("MCP_APPS") / "exclude-app" ("MCP_EXCLUDE_APPS"), "these apps", "these apps"
/// );
/// type AppFlags = mcp_runtime::flags::FilterFlags<Apps>;
/// ```
#[macro_export]
macro_rules! filter_names {
    ($(#[$doc:meta])* $name:ident: $allow:literal ($allow_env:literal) / $deny:literal ($deny_env:literal), $allow_help:expr, $deny_help:expr $(,)?) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name;

        impl $crate::flags::FilterNames for $name {
            const ALLOW: &'static str = $allow;
            const ALLOW_ENV: &'static str = $allow_env;
            const DENY: &'static str = $deny;
            const DENY_ENV: &'static str = $deny_env;
            const ALLOW_HELP: &'static str = $allow_help;
            const DENY_HELP: &'static str = $deny_help;
        }
    };
}

/// Declares a marker type `$name` that names a [`TlsFlags`] group: the peer, and each file's
/// flag and variable.
#[macro_export]
macro_rules! tls_names {
    ($(#[$doc:meta])* $name:ident: $peer:literal, ca $ca:literal ($ca_env:literal), cert $cert:literal ($cert_env:literal), key $key:literal ($key_env:literal) $(,)?) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name;

        impl $crate::flags::TlsNames for $name {
            const PEER: &'static str = $peer;
            const CA: (&'static str, &'static str) = ($ca, $ca_env);
            const CERT: (&'static str, &'static str) = ($cert, $cert_env);
            const KEY: (&'static str, &'static str) = ($key, $key_env);
        }
    };
}

/// An allow list and a deny list of names or globs (`*`, `?`), each comma-separated or repeated:
/// a name passes when the allow list is empty or matches it, and the deny list does not.
#[derive(Clone, Debug)]
pub struct FilterFlags<N> {
    /// The allow list (empty: everything).
    pub allow: Vec<String>,
    /// The deny list (it wins).
    pub deny: Vec<String>,
    names: PhantomData<N>,
}

impl<N> Default for FilterFlags<N> {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            deny: Vec::new(),
            names: PhantomData,
        }
    }
}

impl<N: FilterNames> FilterFlags<N> {
    /// From lists (for tests and programs that build configs by hand).
    pub fn new(allow: Vec<String>, deny: Vec<String>) -> Self {
        Self {
            allow,
            deny,
            names: PhantomData,
        }
    }

    /// The filter these flags describe.
    pub fn filter(&self) -> NameFilter {
        NameFilter::new(self.allow.clone(), self.deny.clone())
    }
}

fn list(name: &'static str, env: &'static str, help: String) -> Arg {
    Arg::new(name)
        .long(name)
        .env(env)
        .value_delimiter(',')
        .action(ArgAction::Append)
        .value_name("NAME")
        .help(help)
}

impl<N: FilterNames> Args for FilterFlags<N> {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(list(
            N::ALLOW,
            N::ALLOW_ENV,
            format!(
                "Only {} (names or globs with `*` and `?`; comma-separated or repeated)",
                N::ALLOW_HELP
            ),
        ))
        .arg(list(
            N::DENY,
            N::DENY_ENV,
            format!(
                "Never {} (names or globs; wins over --{})",
                N::DENY_HELP,
                N::ALLOW
            ),
        ))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

fn strings(m: &ArgMatches, id: &str) -> Vec<String> {
    m.get_many::<String>(id)
        .map(|v| v.cloned().collect())
        .unwrap_or_default()
}

impl<N: FilterNames> FromArgMatches for FilterFlags<N> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self::new(strings(m, N::ALLOW), strings(m, N::DENY)))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// The names of a registry client's TLS flags.
pub trait TlsNames: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// Who the client talks to, for `--help` and logs (`Consul`).
    const PEER: &'static str;
    /// CA bundle flag (`consul-ca`) and its environment variable (`CONSUL_CACERT`).
    const CA: (&'static str, &'static str);
    /// Client certificate flag and variable.
    const CERT: (&'static str, &'static str);
    /// Client key flag and variable.
    const KEY: (&'static str, &'static str);
}

/// A CA bundle to verify the registry's HTTPS certificate (beside the system roots) and a client
/// certificate for registries that ask for one; all PEM files, re-read when they change.
#[derive(Clone, Debug)]
pub struct TlsFlags<N> {
    /// CA bundle.
    pub ca: Option<PathBuf>,
    /// Client certificate.
    pub client_cert: Option<PathBuf>,
    /// Key of the client certificate.
    pub client_key: Option<PathBuf>,
    names: PhantomData<N>,
}

impl<N> Default for TlsFlags<N> {
    fn default() -> Self {
        Self {
            ca: None,
            client_cert: None,
            client_key: None,
            names: PhantomData,
        }
    }
}

impl<N: TlsNames> TlsFlags<N> {
    /// HTTP client settings with these files (verification on, no idle cap, no timeout).
    pub fn settings(&self) -> HttpSettings {
        let mut s = HttpSettings::new(N::PEER);
        s.ca = self.ca.clone();
        s.identity = self.client_cert.clone().zip(self.client_key.clone());
        s
    }
}

fn file(flag: (&'static str, &'static str), help: String) -> Arg {
    Arg::new(flag.0)
        .long(flag.0)
        .env(flag.1)
        .value_name("FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .help(help)
}

impl<N: TlsNames> Args for TlsFlags<N> {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(file(
            N::CA,
            format!(
                "CA bundle (PEM) to verify {}'s HTTPS certificate, beside the system roots (re-read when it changes)",
                N::PEER
            ),
        ))
        .arg(
            file(
                N::CERT,
                format!(
                    "Client certificate (PEM) for {} servers that ask for one",
                    N::PEER
                ),
            )
            .requires(N::KEY.0),
        )
        .arg(file(N::KEY, "Key (PEM) of the client certificate".into()).requires(N::CERT.0))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<N: TlsNames> FromArgMatches for TlsFlags<N> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let path = |id: &str| m.get_one::<PathBuf>(id).cloned();
        Ok(Self {
            ca: path(N::CA.0),
            client_cert: path(N::CERT.0),
            client_key: path(N::KEY.0),
            names: PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// `--max-response-size`, for adapters that read their registry over HTTP.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct ResponseFlags {
    /// Largest answer read from the registry (`64MiB`, `512KiB`). A larger one is not read on:
    /// it is an error naming the URL and this limit, the watch fails as in an outage
    /// (`/registryz` 503) and the last good state stays served.
    #[arg(
        long,
        env = "MCP_MAX_RESPONSE_SIZE",
        default_value = "64MiB",
        value_parser = response_size
    )]
    pub max_response_size: u64,
}

impl Default for ResponseFlags {
    fn default() -> Self {
        Self {
            max_response_size: crate::http_client::DEFAULT_MAX_RESPONSE,
        }
    }
}

/// A byte count above 0.
fn response_size(s: &str) -> Result<u64, String> {
    match parse::size(s)? {
        0 => Err(format!("invalid size {s:?}: must be above 0")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    crate::filter_names!(
        /// Test names.
        Apps: "app" ("TEST_FLAGS_APPS") / "exclude-app" ("TEST_FLAGS_EXCLUDE_APPS"),
        "these apps", "these apps"
    );

    crate::tls_names!(
        /// Test names.
        Peer: "Peer",
        ca "peer-ca" ("TEST_FLAGS_PEER_CA"),
        cert "peer-client-cert" ("TEST_FLAGS_PEER_CERT"),
        key "peer-client-key" ("TEST_FLAGS_PEER_KEY"),
    );

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        apps: FilterFlags<Apps>,
        #[command(flatten)]
        tls: TlsFlags<Peer>,
        #[command(flatten)]
        response: ResponseFlags,
    }

    #[test]
    fn flags_under_the_adapters_names() {
        Cli::command_for_test().debug_assert();
        let cli = Cli::try_parse_from([
            "x",
            "--app",
            "a,b*",
            "--app",
            "c",
            "--exclude-app",
            "bad",
            "--peer-ca",
            "ca.pem",
        ])
        .expect("parses");
        assert_eq!(cli.apps.allow, ["a", "b*", "c"]);
        assert_eq!(cli.apps.deny, ["bad"]);
        assert!(cli.apps.filter().allows("a") && !cli.apps.filter().allows("bad"));
        assert_eq!(cli.tls.ca, Some(PathBuf::from("ca.pem")));
        assert_eq!(cli.tls.settings().peer, "Peer");
        // A certificate without its key is refused, as before.
        assert!(Cli::try_parse_from(["x", "--peer-client-cert", "c.pem"]).is_err());
        let defaults = Cli::try_parse_from(["x"]).expect("parses");
        assert!(defaults.apps.allow.is_empty() && defaults.tls.client_cert.is_none());
        assert_eq!(defaults.response.max_response_size, 64 << 20);
        assert_eq!(
            ResponseFlags::default().max_response_size,
            defaults.response.max_response_size
        );
        let small = Cli::try_parse_from(["x", "--max-response-size", "512KiB"]).expect("parses");
        assert_eq!(small.response.max_response_size, 512 << 10);
        for bad in ["0", "lots"] {
            assert!(Cli::try_parse_from(["x", "--max-response-size", bad]).is_err());
        }
    }

    impl Cli {
        fn command_for_test() -> Command {
            <Self as clap::CommandFactory>::command()
        }
    }
}
