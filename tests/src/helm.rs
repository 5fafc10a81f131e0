//! The real `helm` (helm.sh/helm/v3, built from the Go module proxy by tests/helm/build.sh;
//! `HELM_BIN`, default `target/helm/helm`) and the chart `deploy/helm/mcp-adapters`, for the
//! chart's tests (tests/tests/helm_chart.rs, tests/tests/helm_monitoring.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::peer_file;

/// The release name the chart's tests use.
pub const RELEASE: &str = "mcp-adapters";

/// The chart's directory.
pub fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/mcp-adapters")
}

/// The path of the chart's `ci/<file>`.
pub fn ci(file: &str) -> String {
    chart().join("ci").join(file).display().to_string()
}

/// The real helm, with its cache, config and data directories in a temporary directory of its
/// own (nothing written to `~/.cache/helm`).
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    /// helm from `HELM_BIN` (default `target/helm/helm`); panics with the build hint if missing.
    pub fn new() -> Helm {
        Helm {
            bin: peer_file("HELM_BIN", "helm/helm", "tests/helm/build.sh target/helm"),
            home: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// Runs helm with `args`, whatever its outcome.
    pub fn run(&self, args: &[&str]) -> Output {
        let h = self.home.path();
        Command::new(&self.bin)
            .args(args)
            .env("HELM_CACHE_HOME", h.join("cache"))
            .env("HELM_CONFIG_HOME", h.join("config"))
            .env("HELM_DATA_HOME", h.join("data"))
            .env_remove("KUBECONFIG")
            .env_remove("HELM_NAMESPACE")
            .output()
            .expect("run helm")
    }

    /// stdout of a command that must succeed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "helm {}: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).expect("helm prints UTF-8")
    }

    /// `helm template` of the chart (release [`RELEASE`]) into namespace `ns` with the values
    /// files and `--set`s given: the rendered objects.
    pub fn template(&self, ns: &str, values: &[&str], sets: &[&str]) -> Vec<Value> {
        self.template_with(ns, values, sets, &[])
    }

    /// [`Helm::template`] with more arguments (`--api-versions ...`).
    pub fn template_with(
        &self,
        ns: &str,
        values: &[&str],
        sets: &[&str],
        extra: &[&str],
    ) -> Vec<Value> {
        let chart = chart().display().to_string();
        let mut args = vec!["template", RELEASE, chart.as_str(), "--namespace", ns];
        for v in values {
            args.extend(["--values", v]);
        }
        for s in sets {
            args.extend(["--set", s]);
        }
        args.extend(extra);
        documents(&self.ok(&args), "helm template")
    }
}

impl Default for Helm {
    fn default() -> Self {
        Self::new()
    }
}

/// The documents of a YAML stream (empty ones left out).
pub fn documents(text: &str, what: &str) -> Vec<Value> {
    use serde::Deserialize;
    yaml_serde::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}
