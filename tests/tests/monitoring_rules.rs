//! The monitoring files of deploy/helm/mcp-adapters/monitoring (also reached as deploy/monitoring),
//! checked as files: what the end-to-end monitoring test runs against a real Prometheus and
//! Alertmanager is tests/tests/monitoring.rs.
//!
//! - alerts.yaml passes `promtool check rules`, and its unit tests alerts_test.yaml pass
//!   `promtool test rules` (Debian's promtool 2.42, the Prometheus the tests run; installed by
//!   scripts/install-prometheus.sh; `$PROMTOOL_BIN` overrides /usr/bin/promtool). Those two are
//!   ignored without it and run by the README's command (`--include-ignored`), which installs it:
//!   a missing promtool fails them with that hint, never skips them.
//! - Every alert has a severity (critical, warning, info), a summary, a description and a
//!   runbook_url naming its own section of docs/runbooks.md, and that section exists.
//! - Every alert is exercised by alerts_test.yaml, firing at least once and quiet at least once
//!   (promtool passes a test of an alert name that does not exist: the names are checked here).
//! - Every query of dashboard.json is valid PromQL (each, with its variables given values, as a
//!   recording rule through `promtool check rules`; ignored without promtool like the above),
//!   uses `$__rate_interval` for its ranges and only the dashboard's variables, and every
//!   `mcp_adapter_*` metric the alerts and the dashboard name is one the workspace's sources
//!   register.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const PROMTOOL_HINT: &str = "run scripts/install-prometheus.sh (the README's test command does)";
const SEVERITIES: [&str; 3] = ["critical", "warning", "info"];
/// Where every runbook_url points, up to the section's anchor.
const RUNBOOKS_SUFFIX: &str = "docs/runbooks.md#";
/// The template variables the dashboard's queries may use (Grafana's own `$__rate_interval`
/// aside), each with the value the checks give it (what "All" selects).
const VARIABLES: [(&str, &str); 3] = [("registry", ".*"), ("instance", ".*"), ("shard", ".*")];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn monitoring_dir() -> PathBuf {
    repo().join("deploy/helm/mcp-adapters/monitoring")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn yaml(file: &str) -> Value {
    let path = monitoring_dir().join(file);
    yaml_serde::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard() -> Value {
    let path = monitoring_dir().join("dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn promtool() -> PathBuf {
    let path = std::env::var_os("PROMTOOL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/promtool"));
    assert!(
        path.is_file(),
        "{} missing: {PROMTOOL_HINT}",
        path.display()
    );
    path
}

/// Runs promtool in `dir`; panics with its output unless it succeeds.
fn promtool_ok(dir: &Path, args: &[&str]) -> String {
    let (ok, text) = promtool_run(dir, args);
    assert!(ok, "promtool {args:?} failed:\n{text}");
    text
}

/// Runs promtool in `dir`: whether it succeeded, and its output (stdout then stderr).
fn promtool_run(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run promtool: {e} ({PROMTOOL_HINT})"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every alerting rule of alerts.yaml, by name.
fn alerts() -> BTreeMap<String, Value> {
    let rules = yaml("alerts.yaml");
    let groups = rules["groups"].as_array().expect("alerts.yaml: groups");
    assert!(!groups.is_empty(), "alerts.yaml: no groups");
    let mut alerts = BTreeMap::new();
    for group in groups {
        for rule in group["rules"].as_array().expect("a group's rules") {
            if let Some(name) = rule["alert"].as_str() {
                assert!(
                    alerts.insert(name.to_string(), rule.clone()).is_none(),
                    "alert {name} defined twice"
                );
            }
        }
    }
    alerts
}

/// GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headings of docs/runbooks.md, by anchor.
fn runbook_sections() -> BTreeMap<String, String> {
    let text = read(&repo().join("docs/runbooks.md"));
    let mut in_code = false;
    let mut sections = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code {
            continue;
        }
        if let Some(title) = line.strip_prefix('#') {
            let title = title.trim_start_matches('#').trim().to_string();
            sections.insert(anchor(&title), title);
        }
    }
    sections
}

#[test]
fn every_alert_has_a_severity_a_summary_and_its_runbook() {
    let alerts = alerts();
    assert!(alerts.len() >= 20, "only {} alerts", alerts.len());
    let sections = runbook_sections();
    for (name, rule) in &alerts {
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            SEVERITIES.contains(&severity),
            "{name}: severity {severity:?}, not one of {SEVERITIES:?}"
        );
        for key in ["summary", "description", "runbook_url"] {
            let text = rule["annotations"][key].as_str().unwrap_or_default();
            assert!(!text.trim().is_empty(), "{name}: no {key} annotation");
        }
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let want = format!("{RUNBOOKS_SUFFIX}{}", anchor(name));
        assert!(
            url.ends_with(&want),
            "{name}: runbook_url {url} does not end with {want}"
        );
        assert!(
            sections.get(&anchor(name)).is_some_and(|t| t == name),
            "docs/runbooks.md has no section headed {name}"
        );
    }
    // No runbook left behind for an alert that is gone or renamed.
    for title in sections.values() {
        if title.starts_with("MCPAdapter") {
            assert!(
                alerts.contains_key(title),
                "docs/runbooks.md: section {title} is not an alert of alerts.yaml"
            );
        }
    }
    // One base for every link: the place the runbooks are published.
    let bases: BTreeSet<&str> = alerts
        .values()
        .filter_map(|r| r["annotations"]["runbook_url"].as_str())
        .filter_map(|u| u.split(RUNBOOKS_SUFFIX).next())
        .collect();
    assert_eq!(bases.len(), 1, "runbook_url bases: {bases:?}");
}

#[test]
fn every_alert_is_unit_tested_firing_and_quiet() {
    let alerts = alerts();
    let tests = yaml("alerts_test.yaml");
    assert_eq!(
        tests["rule_files"],
        serde_json::json!(["alerts.yaml"]),
        "alerts_test.yaml must test alerts.yaml"
    );
    // Per alert: (cases where it fires, cases where it must not).
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for test in tests["tests"].as_array().expect("alerts_test.yaml: tests") {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname");
            assert!(
                alerts.contains_key(name),
                "alerts_test.yaml tests {name}, which alerts.yaml does not have"
            );
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            let entry = cases.entry(name.to_string()).or_default();
            if expected > 0 {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
            for alert in case["exp_alerts"].as_array().into_iter().flatten() {
                for key in ["summary", "description", "runbook_url"] {
                    assert!(
                        alert["exp_annotations"][key].is_string(),
                        "alerts_test.yaml: a firing {name} without its exact {key}"
                    );
                }
                assert!(
                    alert["exp_labels"]["severity"].is_string(),
                    "alerts_test.yaml: a firing {name} without its labels"
                );
            }
        }
    }
    for name in alerts.keys() {
        let (firing, quiet) = cases.get(name).copied().unwrap_or_default();
        assert!(
            firing > 0,
            "alerts_test.yaml has no case where {name} fires"
        );
        assert!(
            quiet > 0,
            "alerts_test.yaml has no case where {name} must not fire"
        );
    }
}

#[test]
#[ignore = "needs promtool: scripts/install-prometheus.sh (the README's test command runs it)"]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = monitoring_dir();
    let checked = promtool_ok(&dir, &["check", "rules", "alerts.yaml"]);
    let found = format!("SUCCESS: {} rules found", alerts().len());
    assert!(
        checked.contains(&found),
        "promtool check rules: expected {found:?}:\n{checked}"
    );
    let tested = promtool_ok(&dir, &["test", "rules", "alerts_test.yaml"]);
    assert!(tested.contains("SUCCESS"), "promtool test rules:\n{tested}");
}

/// Every query of the dashboard: (panel title, expression).
fn dashboard_queries(d: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in d["panels"].as_array().expect("dashboard: panels") {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "dashboard panel {title:?}: no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(
                !expr.trim().is_empty(),
                "panel {title:?}: a target without expr"
            );
            queries.push((title.clone(), expr.to_string()));
        }
    }
    queries
}

/// `expr` with the dashboard's variables (`$name` or `${name}`) given values and
/// `$__rate_interval` a window; panics on a variable the dashboard does not define.
fn substituted(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(braced) => {
                let name = braced.split('}').next().unwrap_or_default();
                (name, name.len() + 2)
            }
            None => {
                let len = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..len], len)
            }
        };
        let value = match name {
            "__rate_interval" => "1m",
            _ => VARIABLES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("${name}: not a variable of the dashboard, in {expr}")),
        };
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

#[test]
#[ignore = "needs promtool: scripts/install-prometheus.sh (the README's test command runs it)"]
fn every_dashboard_query_is_valid_promql() {
    let queries = dashboard_queries(&dashboard());
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| {
            serde_json::json!({"record": format!("dashboard:query:{i}"), "expr": substituted(expr)})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().expect("tempdir");
    // JSON is YAML: promtool reads it as a rule file.
    std::fs::write(dir.path().join("queries.yaml"), file.to_string()).expect("write rules");
    let (ok, text) = promtool_run(dir.path(), &["check", "rules", "queries.yaml"]);
    // promtool names a bad rule by its index in the group: say which panel it is.
    let which: Vec<String> = queries
        .iter()
        .enumerate()
        .map(|(i, (title, expr))| format!("  rule {i}: panel {title:?}: {expr}"))
        .collect();
    assert!(
        ok,
        "dashboard queries rejected by promtool:\n{text}\n{}",
        which.join("\n")
    );
    let found = format!("SUCCESS: {} rules found", queries.len());
    assert!(
        text.contains(&found),
        "promtool: expected {found:?}:\n{text}"
    );
}

#[test]
fn the_dashboard_has_its_variables_and_uses_only_them() {
    let d = dashboard();
    let vars: BTreeMap<String, Value> = d["templating"]["list"]
        .as_array()
        .expect("dashboard: templating.list")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_string(),
                v.clone(),
            )
        })
        .collect();
    assert_eq!(
        vars["datasource"]["type"], "datasource",
        "dashboard: no Prometheus datasource variable"
    );
    assert_eq!(vars["datasource"]["query"], "prometheus");
    for key in ["/query/query", "/definition"] {
        assert_eq!(
            vars["registry"].pointer(key),
            Some(&Value::from(
                "label_values(mcp_adapter_resources, registry)"
            )),
            "variable registry: {key}"
        );
    }
    for (name, _) in VARIABLES {
        let v = vars
            .get(name)
            .unwrap_or_else(|| panic!("dashboard: no variable {name}"));
        assert_eq!(v["type"], "query", "variable {name}");
        assert_eq!(
            v["allValue"], ".*",
            "variable {name}: All must match any value"
        );
    }
    for panel in d["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            ["timeseries", "stat"].contains(&panel["type"].as_str().unwrap_or_default()),
            "panel {title:?}: type {}",
            panel["type"]
        );
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title:?}: not on the datasource variable"
        );
    }
    for (title, expr) in dashboard_queries(&d) {
        // Every range is Grafana's rate interval, so that a rate has samples at any scrape
        // interval and zoom.
        for range in expr.split('[').skip(1) {
            let window = range.split(']').next().unwrap_or_default();
            assert_eq!(
                window, "$__rate_interval",
                "panel {title:?}: range [{window}] in {expr}"
            );
        }
        // Panics on a variable the dashboard does not define.
        substituted(&expr);
        assert!(
            expr.contains("job=\"mcp-adapters\""),
            "panel {title:?}: not limited to job mcp-adapters: {expr}"
        );
    }
}

/// The `mcp_adapter_*` names in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("mcp_adapter_") {
        let preceded = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        if !preceded {
            names.insert(name);
        }
    }
    names
}

/// The string literals of the workspace crates' sources (`*/src/**/*.rs`, tests and benches
/// aside), as one text to search.
fn registered_sources() -> String {
    fn walk(dir: &Path, out: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&read(&path));
            }
        }
    }
    let mut out = String::new();
    for entry in std::fs::read_dir(repo())
        .expect("read the workspace")
        .flatten()
    {
        let crate_dir = entry.path();
        // Every crate but the end-to-end tests (whose fakes are not the adapters).
        if crate_dir.join("Cargo.toml").is_file() && entry.file_name() != "tests" {
            walk(&crate_dir.join("src"), &mut out);
        }
    }
    out
}

#[test]
fn the_alerts_and_the_dashboard_name_only_registered_metrics() {
    let sources = registered_sources();
    assert!(
        sources.contains("\"mcp_adapter_resources\""),
        "the workspace sources were not found"
    );
    let registered = |name: &str| sources.contains(&format!("\"{name}\""));
    let mut used: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for (_, expr) in dashboard_queries(&dashboard()) {
        for name in metric_names(&expr) {
            used.entry(name).or_default().insert("dashboard.json");
        }
    }
    for rule in alerts().values() {
        for name in metric_names(rule["expr"].as_str().unwrap_or_default()) {
            used.entry(name).or_default().insert("alerts.yaml");
        }
    }
    assert!(used.len() > 20, "only {} metric names found", used.len());
    let mut unknown = Vec::new();
    for (name, files) in &used {
        // A histogram's series are its registered name with one of these suffixes.
        let histogram_series = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .any(registered);
        if !registered(name) && !histogram_series {
            unknown.push(format!("{name} (in {files:?})"));
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics no workspace source registers: {unknown:?}"
    );
}

#[test]
fn plain_prometheus_finds_the_files_under_deploy_monitoring() {
    let link = repo().join("deploy/monitoring");
    let target = std::fs::read_link(&link)
        .unwrap_or_else(|e| panic!("{}: not a symlink: {e}", link.display()));
    assert_eq!(target, Path::new("helm/mcp-adapters/monitoring"));
    for file in ["alerts.yaml", "alerts_test.yaml", "dashboard.json"] {
        assert!(
            link.join(file).is_file(),
            "deploy/monitoring/{file} missing"
        );
    }
}
