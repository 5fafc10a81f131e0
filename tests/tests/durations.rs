//! A bare number given to a duration flag is refused by every binary, with the same message
//! saying which flag and suggesting the unit: it meant milliseconds in the adapters' flags and
//! seconds in mcpctl's once, so neither reading is guessed.
//!
//! Each binary is run with one of its own duration flags (and adapter-file with a common one,
//! and one through its environment variable) and must exit at once with clap's usage error.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::workspace_bin;

/// The message `mcp_core::parse::duration` gives for a bare `60`.
const DID_YOU_MEAN: &str = "invalid duration \"60\": a bare number has no unit: did you mean 60s? \
                            (units: us, ms, s, m, h)";

/// Runs `bin args` with `env` and returns its stderr, asserting it exited with clap's usage
/// error (2) quickly, without starting anything.
fn refused(bin: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let started = Instant::now();
    let out = Command::new(workspace_bin(bin))
        .args(args)
        .envs(env.iter().copied())
        // Whatever the machine's environment says, the flags under test decide.
        .env_remove("MCP_COALESCE")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{bin} took {:?} to refuse a flag",
        started.elapsed()
    );
    assert!(
        out.stdout.is_empty(),
        "{bin}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

#[test]
fn a_bare_number_is_refused_by_every_binary_naming_the_flag() {
    let cases: [(&str, &[&str], &str); 8] = [
        (
            "adapter-file",
            &["--path", ".", "--poll-interval", "60"],
            "--poll-interval",
        ),
        (
            "adapter-file",
            &["--path", ".", "--coalesce", "60"],
            "--coalesce",
        ),
        ("adapter-consul", &["--consul-wait", "60"], "--consul-wait"),
        (
            "adapter-zookeeper",
            &["--zk-session-timeout", "60"],
            "--zk-session-timeout",
        ),
        (
            "adapter-eureka",
            &["--refresh-interval", "60"],
            "--refresh-interval",
        ),
        (
            "adapter-kube",
            &["--watch-timeout", "60"],
            "--watch-timeout",
        ),
        (
            "adapter-nacos",
            &["--service-list-interval", "60"],
            "--service-list-interval",
        ),
        (
            "mcpctl",
            &[
                "get",
                "serviceentries",
                "--server",
                "xds://127.0.0.1:1",
                "--timeout",
                "60",
            ],
            "--timeout",
        ),
    ];
    for (bin, args, flag) in cases {
        let stderr = refused(bin, args, &[]);
        assert!(
            stderr.contains(DID_YOU_MEAN),
            "{bin} {args:?}: no \"did you mean 60s?\": {stderr}"
        );
        assert!(
            stderr.contains(&format!("'{flag} ")),
            "{bin}: the message does not name {flag}: {stderr}"
        );
    }
}

#[test]
fn a_bare_number_in_an_environment_variable_is_refused_too() {
    let stderr = refused(
        "adapter-eureka",
        &["--eureka-url", "http://127.0.0.1:1/eureka"],
        &[("MCP_EUREKA_REFRESH_INTERVAL", "60")],
    );
    assert!(stderr.contains(DID_YOU_MEAN), "{stderr}");
    assert!(stderr.contains("--refresh-interval"), "{stderr}");
}
