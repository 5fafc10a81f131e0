//! What makes two processes the same adapter: the fingerprint of the flags that decide what it
//! serves. Replicas of one Deployment share their flags, so they share it; two adapters that
//! would write the same objects (one registry type, one `--source-name`, one shard) but watch
//! different registries, directories or service slices do not. The Kubernetes output puts it on
//! its Lease, so a replica never takes over a Lease whose holder serves something else.
//!
//! Every flag counts (the adapter's own included, as the command line or the environment gave
//! it) except those that say where this process listens, logs, connects its output or how fast
//! it writes: two replicas may differ there and still serve the same set. A flag left at its
//! default counts as absent, so a new release that changes a default is not a new adapter.

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command};

use crate::cli::ServerArgs;

/// Flags that never change the served set (besides every `ServerArgs` limit).
const OPERATIONAL: &[&str] = &[
    "listen",
    "admin_listen",
    "log_format",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "tls_client_san",
    "tls_reload_interval",
    "state_file",
    "coalesce",
    "output",
    "output_kubeconfig",
    "output_context",
    "output_lease_namespace",
    "output_identity",
    "output_qps",
    "output_burst",
    "output_resync",
    "help",
    "version",
];

/// The flags that lay the served set out in shards without changing it (`--shard`,
/// `--shards`).
const LAYOUT: &[&str] = &["shard", "shards"];

/// 16 hex digits over the serving flags in `matches`, parsed by `command` (xxh3: stable across
/// releases and machines).
pub fn of(command: &Command, matches: &ArgMatches) -> String {
    hash(command, matches, &[])
}

/// [`of`] without the shard layout: the same adapter under another `--shard`/`--shards` (or
/// none) has the same one. What the Kubernetes output writes on its objects, so that after a
/// change of layout (one process serving N shards, N processes one each, or none) the objects
/// of the layout before are taken over once their Lease has no holder, where under the whole
/// fingerprint they stayed another adapter's forever. (The Lease itself keeps [`of`]: replicas
/// of different layouts never share one.)
pub fn of_layout_free(command: &Command, matches: &ArgMatches) -> String {
    hash(command, matches, LAYOUT)
}

fn hash(command: &Command, matches: &ArgMatches, also_skip: &[&str]) -> String {
    let server = ServerArgs::augment_args(Command::new("server"));
    let skip = |id: &str| {
        OPERATIONAL.contains(&id)
            || also_skip.contains(&id)
            || server.get_arguments().any(|a| a.get_id().as_str() == id)
    };
    let mut ids: Vec<&str> = matches
        .ids()
        .map(|id| id.as_str())
        .filter(|id| !skip(id))
        .collect();
    ids.sort_unstable();
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for id in ids {
        if !matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let Ok(Some(values)) = matches.try_get_raw(id) else {
            continue;
        };
        // Flattened groups are ids too (their values are argument names): only arguments count.
        let Some(arg) = command.get_arguments().find(|a| a.get_id().as_str() == id) else {
            continue;
        };
        let values: Vec<_> = values.collect();
        let default = arg.get_default_values();
        if !default.is_empty()
            && values
                .iter()
                .copied()
                .eq(default.iter().map(|d| d.as_os_str()))
        {
            continue;
        }
        h.update(id.as_bytes());
        for v in values {
            h.update(b"\0");
            h.update(v.as_encoded_bytes());
        }
        h.update(b"\n");
    }
    format!("{:016x}", h.digest())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CommonArgs;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        common: CommonArgs,
        /// An adapter's own flag.
        #[arg(long)]
        path: Option<String>,
        #[arg(long, default_value = "1s")]
        poll: String,
    }

    fn fp(args: &[&str]) -> String {
        let cmd = <Flags as clap::CommandFactory>::command();
        let m = cmd
            .clone()
            .try_get_matches_from(std::iter::once("adapter").chain(args.iter().copied()))
            .expect("parses");
        of(&cmd, &m)
    }

    fn layout_free(args: &[&str]) -> String {
        let cmd = <Flags as clap::CommandFactory>::command();
        let m = cmd
            .clone()
            .try_get_matches_from(std::iter::once("adapter").chain(args.iter().copied()))
            .expect("parses");
        of_layout_free(&cmd, &m)
    }

    /// #43 item 3: one adapter in every shard layout has one layout-free fingerprint (what its
    /// objects carry); the whole fingerprint (what its Lease carries) tells the layouts apart.
    #[test]
    fn every_shard_layout_of_one_adapter_shares_the_objects_fingerprint() {
        let layouts: [&[&str]; 4] = [
            &[],
            &["--shards", "3"],
            &["--shard", "1/3"],
            &["--shard", "0/2"],
        ];
        fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
            let mut a = vec!["--path", "/a"];
            a.extend_from_slice(extra);
            a
        }
        let free: Vec<String> = layouts.iter().map(|l| layout_free(&with(l))).collect();
        assert!(free.windows(2).all(|w| w[0] == w[1]), "{free:?}");
        let whole: Vec<String> = layouts.iter().map(|l| fp(&with(l))).collect();
        let mut distinct = whole.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), layouts.len(), "{whole:?}");
        // Another adapter is still another, in any layout.
        assert_ne!(layout_free(&["--path", "/b", "--shards", "3"]), free[0]);
    }

    #[test]
    fn replicas_agree_and_other_adapters_differ() {
        let base = fp(&["--path", "/a", "--output", "kube"]);
        // Where it listens, who it is, how its output writes: the same adapter.
        assert_eq!(
            base,
            fp(&[
                "--path",
                "/a",
                "--output",
                "both",
                "--listen",
                "127.0.0.1:1",
                "--admin-listen",
                "127.0.0.1:2",
                "--output-identity",
                "pod-b",
                "--output-qps",
                "5",
                "--max-connections",
                "3",
            ])
        );
        // A default spelled out is still the default.
        assert_eq!(base, fp(&["--path", "/a", "--poll", "1s"]));
        // Another directory, another slice of services, another namespace: another adapter.
        assert_ne!(base, fp(&["--path", "/b"]));
        assert_ne!(base, fp(&["--path", "/a", "--shard-services", "pay*"]));
        assert_ne!(base, fp(&["--path", "/a", "--namespace", "team"]));
        assert_ne!(base, fp(&["--path", "/a", "--poll", "2s"]));
    }
}
