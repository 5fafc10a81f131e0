//! `mcpctl get serviceentries --server xds://HOST:PORT [-o table|yaml|json] [--watch]`;
//! `mcpctl health [--admin HOST:PORT]`;
//! `mcpctl status ADMIN_ADDRESS... [-o table|json]`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use mcp_core::clip::error_chain;
use mcp_core::parse;
use mcpctl::sink::{ApiVersion, Received, Sink, SinkOptions, TlsOptions, Update};
use mcpctl::{health, render};

/// A small MCP (Istio Mesh Configuration Protocol) sink: shows the ServiceEntries a config
/// source serves, once or as they change.
#[derive(Parser, Debug)]
#[command(name = "mcpctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the ServiceEntries a server serves (the first full state, or every update with
    /// --watch).
    Get(GetArgs),
    /// Exit 0 if an adapter is ready (GET /readyz on its admin port answers 200), 1 if not: a
    /// container HEALTHCHECK that needs no curl and works whether or not the MCP port has TLS.
    Health(HealthArgs),
    /// Per sink of each adapter (node id, address, protocol, type): the version sent, the one
    /// acknowledged and since when, and why a response was rejected; like `istioctl
    /// proxy-status` for config sources. Exit 1 if an adapter could not be read.
    Status(StatusArgs),
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Admin addresses of the adapters, HOST:PORT (their --admin-listen).
    #[arg(required = true, value_name = "ADMIN_ADDRESS")]
    addresses: Vec<String>,
    /// Output format: a table, or every adapter's /debug/syncz as JSON, by address.
    #[arg(short = 'o', long, value_enum, default_value_t = StatusOutput::Table)]
    output: StatusOutput,
    /// How long to wait for each adapter, e.g. 3s, 500ms.
    #[arg(long, default_value = "5s", value_parser = parse::duration)]
    timeout: Duration,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum StatusOutput {
    Table,
    Json,
}

#[derive(Args, Debug)]
struct HealthArgs {
    /// The adapter's admin address, HOST:PORT. Defaults to the adapter's own MCP_ADMIN_LISTEN
    /// (in its container: the same environment), 0.0.0.0 and [::] dialed on loopback.
    #[arg(long, env = "MCP_ADMIN_LISTEN", default_value = "127.0.0.1:15052")]
    admin: String,
    /// How long to wait for the answer, e.g. 3s, 500ms.
    #[arg(long, default_value = "3s", value_parser = parse::duration)]
    timeout: Duration,
}

#[derive(Args, Debug)]
struct GetArgs {
    /// Resource type to get.
    #[arg(value_enum)]
    resource: ResourceKind,
    /// Server: xds://HOST:PORT (MCP-over-xDS), delta://HOST:PORT (delta xDS) or mcp://HOST:PORT
    /// (legacy Istio 1.1-1.7 MCP).
    #[arg(long, env = "MCPCTL_SERVER")]
    server: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Keep the stream open and print the state after every update, each with a timestamp.
    #[arg(short = 'w', long)]
    watch: bool,
    /// ServiceEntry type URL generation to subscribe to (xds and delta).
    #[arg(long, value_enum, default_value_t = ApiVersionArg::V1)]
    api_version: ApiVersionArg,
    /// How long to wait for the server (and, without --watch, for its first response), e.g.
    /// 10s, 500ms, 2m.
    #[arg(long, default_value = "10s", value_parser = parse::duration)]
    timeout: Duration,
    /// Ask a legacy MCP server (mcp://) for incremental responses.
    #[arg(long)]
    incremental: bool,
    /// PEM CA bundle; turns TLS on and verifies the server certificate against it.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Name to verify the server certificate against (default: the host of --server).
    #[arg(long, requires = "tls_ca", value_name = "NAME")]
    tls_server_name: Option<String>,
    /// PEM client certificate for mutual TLS.
    #[arg(long, requires_all = ["tls_ca", "tls_key"], value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    tls_key: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ResourceKind {
    /// Istio ServiceEntries.
    #[value(name = "serviceentries", aliases = ["serviceentry", "se"])]
    ServiceEntries,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Table,
    Yaml,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ApiVersionArg {
    V1,
    V1alpha3,
}

fn options(args: &GetArgs) -> SinkOptions {
    let mut opts = SinkOptions::new(args.server.clone());
    opts.api_version = match args.api_version {
        ApiVersionArg::V1 => ApiVersion::V1,
        ApiVersionArg::V1alpha3 => ApiVersion::V1alpha3,
    };
    opts.incremental = args.incremental;
    opts.connect_timeout = args.timeout;
    opts.tls = args.tls_ca.as_ref().map(|ca| TlsOptions {
        ca: ca.clone(),
        server_name: args.tls_server_name.clone(),
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
    });
    opts
}

/// Renders one state in `output`; with `watch`, prefixed as described in `--help`.
fn render_state(
    output: Output,
    state: &BTreeMap<String, Received>,
    watch: Option<&Update>,
) -> anyhow::Result<String> {
    Ok(match (output, watch) {
        (Output::Table, None) => render::table(state),
        (Output::Table, Some(u)) => format!(
            "# {} version={} resources={}\n{}",
            render::rfc3339_millis(u.at),
            u.version_info,
            state.len(),
            render::table(state)
        ),
        (Output::Json, None) => format!(
            "{}\n",
            serde_json::to_string_pretty(&render::list_json(state))?
        ),
        (Output::Json, Some(u)) => {
            // Written by hand so `time` comes first whatever serde_json's map ordering is.
            format!(
                "{{\"time\":{},\"version\":{},\"items\":{}}}\n",
                serde_json::to_string(&render::rfc3339_millis(u.at))?,
                serde_json::to_string(&u.version_info)?,
                serde_json::to_string(&render::items_json(state))?
            )
        }
        (Output::Yaml, None) => yaml_serde::to_string(&render::list_json(state))?,
        (Output::Yaml, Some(u)) => format!(
            "---\n# time {} version={} resources={}\n{}",
            render::rfc3339_millis(u.at),
            u.version_info,
            state.len(),
            yaml_serde::to_string(&render::list_json(state))?
        ),
    })
}

/// Writes and flushes, so a reader of a pipe sees each update at once.
fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

async fn get(args: GetArgs) -> anyhow::Result<()> {
    let ResourceKind::ServiceEntries = args.resource;
    if args.incremental && !args.server.starts_with("mcp://") {
        bail!("--incremental applies only to mcp:// servers");
    }
    let timeout = args.timeout;
    let mut sink = Sink::connect(options(&args)).await?;
    if !args.watch {
        let update = sink
            .next_within(timeout)
            .await?
            .with_context(|| format!("no response from {} within {timeout:?}", args.server))?;
        return emit(&render_state(args.output, &update.state, None)?);
    }
    loop {
        let update = sink.next().await?;
        emit(&render_state(args.output, &update.state, Some(&update))?)?;
    }
}

/// Prints why, and fails, unless the adapter is ready.
async fn health(args: HealthArgs) -> anyhow::Result<()> {
    let r = health::readyz(&args.admin, args.timeout).await?;
    if !r.ready() {
        bail!(
            "adapter at {} not ready (HTTP {}): {}",
            args.admin,
            r.status,
            r.body
        );
    }
    emit(&format!("{}\n", r.body))
}

/// Prints every adapter's sync status; fails if one could not be read (after printing the rest).
async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let asked = args
        .addresses
        .iter()
        .map(|a| async move { (a.clone(), mcpctl::status::fetch(a, args.timeout).await) });
    let answers = futures::future::join_all(asked).await;
    let unreadable = answers.iter().filter(|(_, a)| a.is_err()).count();
    match args.output {
        StatusOutput::Table => emit(&mcpctl::status::table(&answers))?,
        StatusOutput::Json => {
            let all: BTreeMap<&str, serde_json::Value> = answers
                .iter()
                .map(|(addr, a)| {
                    let v = match a {
                        Ok(z) => serde_json::to_value(z).unwrap_or_default(),
                        Err(e) => serde_json::json!({ "error": e.to_string() }),
                    };
                    (addr.as_str(), v)
                })
                .collect();
            emit(&format!("{}\n", serde_json::to_string_pretty(&all)?))?;
        }
    }
    if unreadable > 0 {
        bail!(
            "{unreadable} of {} adapters could not be read",
            answers.len()
        );
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Get(args) => get(args).await,
        Command::Health(args) => health(args).await,
        Command::Status(args) => status(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`mcpctl ... | head`) is the reader's choice, not a failure.
            if e.downcast_ref::<std::io::Error>()
                .or_else(|| e.root_cause().downcast_ref::<std::io::Error>())
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            // Like `{:#}`, but skips causes whose text an outer message already includes.
            eprintln!("mcpctl: error: {}", error_chain(&*e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn watch_formats() {
        let update = Update {
            at: std::time::UNIX_EPOCH + Duration::from_millis(1_795_359_845_123),
            version_info: "v9".into(),
            nonce: "n".into(),
            state: BTreeMap::new(),
            upserted: vec![],
            removed: vec![],
            incremental: false,
        };
        let table = render_state(Output::Table, &update.state, Some(&update)).unwrap();
        assert_eq!(
            table.lines().next(),
            Some("# 2026-11-22T15:04:05.123Z version=v9 resources=0")
        );
        let yaml = render_state(Output::Yaml, &update.state, Some(&update)).unwrap();
        assert!(
            yaml.starts_with("---\n# time 2026-11-22T15:04:05.123Z version=v9 resources=0\n"),
            "{yaml}"
        );
        let json = render_state(Output::Json, &update.state, Some(&update)).unwrap();
        assert_eq!(
            json,
            "{\"time\":\"2026-11-22T15:04:05.123Z\",\"version\":\"v9\",\"items\":[]}\n"
        );
    }

    #[test]
    fn aliases_parse() {
        for alias in ["serviceentries", "serviceentry", "se"] {
            let cli =
                Cli::try_parse_from(["mcpctl", "get", alias, "--server", "xds://h:1"]).unwrap();
            let Command::Get(args) = cli.command else {
                panic!("parsed as get");
            };
            assert!(matches!(args.resource, ResourceKind::ServiceEntries));
            assert_eq!(args.timeout, Duration::from_secs(10));
            assert_eq!(args.output, Output::Table);
        }
        assert!(
            Cli::try_parse_from(["mcpctl", "get", "se", "--server", "x", "--tls-key", "k"])
                .is_err()
        );
    }
}
