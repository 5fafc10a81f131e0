//! The real Prometheus and Alertmanager (Debian's `prometheus` 2.42 and
//! `prometheus-alertmanager` 0.25, installed by `scripts/install-prometheus.sh`) as test peers:
//! Prometheus scrapes the adapters' admin ports as job `mcp-adapters` every second and evaluates
//! the chart's alert rules (time-compressed, [`Rules`]) every second; Alertmanager, without
//! gossip, groups by alert name and instance and sends every notification to a webhook receiver
//! in the test process ([`Monitoring::wait_alert`] waits on what it recorded).
//!
//! Binaries from `$PROMETHEUS_BIN` and `$ALERTMANAGER_BIN` (default `/usr/bin/prometheus` and
//! `/usr/bin/prometheus-alertmanager`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{free_addr, http_get, Process};

/// The scrape job the chart's ServiceMonitor and the rules name.
pub const JOB: &str = "mcp-adapters";

/// How much faster than real time the rules run here: every `for:`, every range, subquery and
/// offset, and every threshold on an elapsed time (`..._seconds > 300`) is divided by this.
pub const COMPRESSION: u64 = 30;

/// The shortest range a compressed range selector keeps: `rate()` over a range needs two
/// samples in it, and at a 1 s scrape interval a 2 s range (`[1m]` / 30) sometimes holds one
/// (scrape jitter), which would make a rate-based alert flap. Four scrape intervals, as
/// Grafana's `$__rate_interval` keeps.
pub const MIN_RANGE: Duration = Duration::from_secs(4);

/// The chart's rule file (`$MCP_ALERT_RULES` instead, to try a changed rule file).
pub fn rules_path() -> PathBuf {
    std::env::var_os("MCP_ALERT_RULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| monitoring_dir().join("alerts.yaml"))
}

/// The chart's Grafana dashboard.
pub fn dashboard_path() -> PathBuf {
    monitoring_dir().join("dashboard.json")
}

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/mcp-adapters/monitoring")
}

/// A binary named by `env`, else `default`; panics naming the install script when missing.
fn binary(env: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        path.exists(),
        "{} missing: install Prometheus and Alertmanager with scripts/install-prometheus.sh \
         (apt-get install prometheus prometheus-alertmanager), or point ${env} at the binary",
        path.display()
    );
    path
}

/// The Prometheus binary.
pub fn prometheus_bin() -> PathBuf {
    binary("PROMETHEUS_BIN", "/usr/bin/prometheus")
}

/// The Alertmanager binary.
pub fn alertmanager_bin() -> PathBuf {
    binary("ALERTMANAGER_BIN", "/usr/bin/prometheus-alertmanager")
}

// ---------------------------------------------------------------------------------------------
// Time compression.

/// A rule file made to run [`COMPRESSION`] times faster than written.
///
/// Why: the chart's rules wait minutes (`for: 5m`..`10m`, windows of minutes) so that a blip
/// does not page anyone; a test that waited that long for each alert would take hours. So the
/// test divides every duration the rules wait on by 30: `for:` (and `keep_firing_for:`), the
/// ranges, subqueries and offsets inside `expr`, and the number compared with a metric that is
/// itself an elapsed time (a name ending in `_seconds`: `lag_seconds > 300` waits 300 s of
/// lag, so it becomes `> 10`). Rates, ratios and counts are not times and stay as written.
/// The real durations are tested by promtool's unit tests (`alerts_test.yaml`).
#[derive(Clone, Debug)]
pub struct Rules {
    /// The compressed rule file (JSON, which Prometheus reads as YAML).
    pub text: String,
    /// Every alert's name, in file order.
    pub alerts: Vec<String>,
    /// The longest compressed `for:`.
    pub longest_for: Duration,
    /// Each alert's compressed `for:` (zero without one).
    pub fors: BTreeMap<String, Duration>,
    /// Each alert's longest compressed `offset` (zero without one): its expression has no
    /// result before the series it offsets are that old.
    pub offsets: BTreeMap<String, Duration>,
}

impl Rules {
    /// The chart's rules ([`rules_path`]), compressed.
    pub fn real() -> Rules {
        let path = rules_path();
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read the alert rules {}: {e}", path.display()));
        Rules::compress(&text, COMPRESSION)
            .unwrap_or_else(|e| panic!("compress {}: {e}", path.display()))
    }

    /// `yaml` (a Prometheus rule file) with its durations divided by `factor`.
    pub fn compress(yaml: &str, factor: u64) -> Result<Rules, String> {
        let mut doc: Value = yaml_serde::from_str(yaml).map_err(|e| format!("not YAML: {e}"))?;
        let groups = doc["groups"].as_array_mut().ok_or("no `groups:` list")?;
        let mut alerts = Vec::new();
        let mut longest_for = Duration::ZERO;
        let mut fors = BTreeMap::new();
        let mut offsets = BTreeMap::new();
        for group in groups {
            // Every group is evaluated at the global 1 s interval.
            if let Some(g) = group.as_object_mut() {
                g.remove("interval");
            }
            let rules = group["rules"]
                .as_array_mut()
                .ok_or("a group without `rules:`")?;
            for rule in rules {
                let Some(rule) = rule.as_object_mut() else {
                    return Err("a rule that is not a mapping".into());
                };
                let name = rule
                    .get("alert")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if let Some(name) = &name {
                    alerts.push(name.clone());
                    fors.insert(name.clone(), Duration::ZERO);
                }
                for key in ["for", "keep_firing_for"] {
                    if let Some(v) = rule.get(key) {
                        let d = v
                            .as_str()
                            .ok_or_else(|| format!("{key}: {v} is not a duration"))?;
                        let ms = parse_duration_ms(d)
                            .ok_or_else(|| format!("{key}: {d:?} is not a duration"))?
                            / factor;
                        if key == "for" {
                            longest_for = longest_for.max(Duration::from_millis(ms));
                            if let Some(name) = &name {
                                fors.insert(name.clone(), Duration::from_millis(ms));
                            }
                        }
                        rule.insert(key.to_string(), Value::from(format_duration_ms(ms)));
                    }
                }
                let expr = match rule.get("expr") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    other => return Err(format!("a rule without an `expr:` string: {other:?}")),
                };
                let compressed = compress_expr(&expr, factor);
                if let Some(name) = &name {
                    offsets.insert(name.clone(), longest_offset(&compressed));
                }
                rule.insert("expr".into(), Value::from(compressed));
            }
        }
        Ok(Rules {
            text: serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
            alerts,
            longest_for,
            fors,
            offsets,
        })
    }

    /// Alert `name`'s compressed `for:`; panics naming the rule file if there is no such alert.
    pub fn for_of(&self, name: &str) -> Duration {
        *self.fors.get(name).unwrap_or_else(|| {
            panic!(
                "no alert {name} in {} (it has {:?})",
                rules_path().display(),
                self.alerts
            )
        })
    }
}

/// The longest `offset` in `expr`.
fn longest_offset(expr: &str) -> Duration {
    let tokens: Vec<Token> = tokenize(expr)
        .into_iter()
        .filter(|t| !matches!(t, Token::Space(_) | Token::Comment(_)))
        .collect();
    tokens
        .windows(2)
        .filter(|w| w[0] == Token::Ident("offset".into()))
        .filter_map(|w| match &w[1] {
            Token::Number(n) => parse_duration_ms(n),
            _ => None,
        })
        .map(Duration::from_millis)
        .max()
        .unwrap_or_default()
}

/// A Prometheus duration (`90s`, `1h30m`, `500ms`) in milliseconds.
pub fn parse_duration_ms(d: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut rest = d;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.chars().take_while(char::is_ascii_alphabetic).count();
        let unit = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// Milliseconds as a Prometheus duration: whole seconds as `Ns`, else `Nms`.
pub fn format_duration_ms(ms: u64) -> String {
    if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

/// One lexical piece of a PromQL expression.
#[derive(Clone, Debug, PartialEq)]
enum Token {
    /// Spaces and newlines.
    Space(String),
    /// A string literal, quotes included.
    Str(String),
    /// `# ...` to the end of the line.
    Comment(String),
    /// A metric, label, function or keyword name.
    Ident(String),
    /// A number or a duration (`300`, `0.5`, `5m`, `1h30m`, `1e3`).
    Number(String),
    /// Anything else: brackets, commas, operators.
    Punct(String),
}

impl Token {
    fn text(&self) -> &str {
        match self {
            Token::Space(s)
            | Token::Str(s)
            | Token::Comment(s)
            | Token::Ident(s)
            | Token::Number(s)
            | Token::Punct(s) => s,
        }
    }
}

fn tokenize(expr: &str) -> Vec<Token> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let take_while = |i: &mut usize, f: &dyn Fn(char) -> bool| -> String {
        let start = *i;
        while *i < chars.len() && f(chars[*i]) {
            *i += 1;
        }
        chars[start..*i].iter().collect()
    };
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            out.push(Token::Space(take_while(&mut i, &|c| c.is_whitespace())));
        } else if c == '#' {
            out.push(Token::Comment(take_while(&mut i, &|c| c != '\n')));
        } else if c == '"' || c == '\'' || c == '`' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != c {
                // Backslash escapes in "..." and '...', none in `...`.
                if chars[i] == '\\' && c != '`' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(chars.len());
            out.push(Token::Str(chars[start..i].iter().collect()));
        } else if c.is_ascii_alphabetic() || c == '_' {
            out.push(Token::Ident(take_while(&mut i, &|c| {
                c.is_ascii_alphanumeric() || c == '_' || c == ':'
            })));
        } else if c.is_ascii_digit()
            || c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)
        {
            let start = i;
            while i < chars.len() {
                let d = chars[i];
                let exponent_sign = (d == '+' || d == '-')
                    && i > start
                    && matches!(chars[i - 1], 'e' | 'E')
                    && chars[start..i - 1]
                        .iter()
                        .all(|c| c.is_ascii_digit() || *c == '.');
                if d.is_ascii_alphanumeric() || d == '.' || exponent_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Token::Number(chars[start..i].iter().collect()));
        } else {
            // Two-character operators first.
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            if ["==", "!=", ">=", "<=", "=~", "!~"].contains(&two.as_str()) {
                out.push(Token::Punct(two));
                i += 2;
            } else {
                out.push(Token::Punct(c.to_string()));
                i += 1;
            }
        }
    }
    out
}

/// A number divided by `factor`, written back as short as it stays exact to a millisecond.
fn divide_number(n: &str, factor: u64) -> Option<String> {
    let v: f64 = n.parse().ok()?;
    if !v.is_finite() {
        return None;
    }
    let d = v / factor as f64;
    if d.fract() == 0.0 && d.abs() < 1e15 {
        Some(format!("{}", d as i64))
    } else {
        let s = format!("{d:.3}");
        Some(s.trim_end_matches('0').trim_end_matches('.').to_string())
    }
}

/// A duration token divided by `factor`; `floor` the least it may become.
fn divide_duration(d: &str, factor: u64, floor: Duration) -> Option<String> {
    let ms = parse_duration_ms(d)? / factor;
    let floor = u64::try_from(floor.as_millis()).unwrap_or(u64::MAX);
    Some(format_duration_ms(ms.max(floor)))
}

/// `expr` with every range, subquery range and step, and offset divided by `factor` (ranges no
/// shorter than [`MIN_RANGE`]), and the number compared with a metric named `*_seconds`
/// divided too: the metric followed (through its label matchers, a range, an offset, closing
/// parentheses, `by (...)` / `without (...)`) by `>`, `<`, `>=`, `<=`, `==` or `!=`, optionally
/// `bool`, then a number. String literals and comments are left as they are.
pub fn compress_expr(expr: &str, factor: u64) -> String {
    let tokens = tokenize(expr);
    let mut out = String::with_capacity(expr.len());
    // Whether what was read last is a `*_seconds` metric (with its matchers, range, offset,
    // closing parentheses and grouping after it): a comparison now compares an elapsed time.
    let mut after_seconds = false;
    let mut i = 0;
    let next_solid = |from: usize| -> Option<usize> {
        (from..tokens.len()).find(|&j| !matches!(tokens[j], Token::Space(_) | Token::Comment(_)))
    };
    // Copies tokens from `i` to the first `close` after `open` (the index of the opening
    // token), both included; the index after it.
    let copy_to = |out: &mut String, i: usize, open: usize, close: &str| -> usize {
        let end = (open..tokens.len())
            .find(|&j| tokens[j].text() == close)
            .unwrap_or(tokens.len() - 1);
        for t in &tokens[i..=end] {
            out.push_str(t.text());
        }
        end + 1
    };
    while i < tokens.len() {
        match &tokens[i] {
            t @ (Token::Space(_) | Token::Comment(_)) => {
                out.push_str(t.text());
                i += 1;
            }
            Token::Punct(p) if p == "[" => {
                // A range `[5m]` or a subquery `[10m:1m]` / `[10m:]`, to the closing bracket.
                out.push('[');
                i += 1;
                let mut part = 0;
                while i < tokens.len() && tokens[i].text() != "]" {
                    match &tokens[i] {
                        Token::Number(n) => {
                            // The range is floored; a subquery's step only kept above zero.
                            let floor = if part == 0 {
                                MIN_RANGE
                            } else {
                                Duration::from_millis(1)
                            };
                            let d = divide_duration(n, factor, floor);
                            out.push_str(d.as_deref().unwrap_or(n));
                        }
                        Token::Punct(c) if c == ":" => {
                            part += 1;
                            out.push(':');
                        }
                        other => out.push_str(other.text()),
                    }
                    i += 1;
                }
                if i < tokens.len() {
                    out.push(']');
                    i += 1;
                }
            }
            Token::Ident(name) if name == "offset" => {
                out.push_str(name);
                i += 1;
                // Spaces, an optional minus, the duration.
                while let Some(t @ Token::Space(_)) = tokens.get(i) {
                    out.push_str(t.text());
                    i += 1;
                }
                if tokens.get(i).is_some_and(|t| t.text() == "-") {
                    out.push('-');
                    i += 1;
                }
                if let Some(Token::Number(n)) = tokens.get(i) {
                    let d = divide_duration(n, factor, Duration::ZERO);
                    out.push_str(d.as_deref().unwrap_or(n));
                    i += 1;
                }
            }
            Token::Ident(name) if after_seconds && (name == "by" || name == "without") => {
                // An aggregation's grouping after its argument: `max(x_seconds) by (instance)`.
                match next_solid(i + 1).filter(|&j| tokens[j].text() == "(") {
                    Some(open) => i = copy_to(&mut out, i, open, ")"),
                    None => {
                        out.push_str(name);
                        i += 1;
                    }
                }
            }
            Token::Ident(name) => {
                out.push_str(name);
                i += 1;
                let is_call = next_solid(i).is_some_and(|j| tokens[j].text() == "(");
                after_seconds = name.ends_with("_seconds") && !is_call;
                if after_seconds {
                    // Its label matchers, copied as they are.
                    if let Some(open) = next_solid(i).filter(|&j| tokens[j].text() == "{") {
                        i = copy_to(&mut out, i, open, "}");
                    }
                }
            }
            Token::Punct(p) if p == ")" => {
                out.push(')');
                i += 1;
            }
            Token::Punct(p)
                if after_seconds && [">", "<", ">=", "<=", "==", "!="].contains(&p.as_str()) =>
            {
                out.push_str(p);
                i += 1;
                after_seconds = false;
                // Spaces, an optional `bool`, spaces, then the number.
                let mut j = i;
                let mut lead = String::new();
                while let Some(t) = tokens.get(j) {
                    match t {
                        Token::Space(_) | Token::Comment(_) => lead.push_str(t.text()),
                        Token::Ident(b) if b == "bool" => lead.push_str(b),
                        _ => break,
                    }
                    j += 1;
                }
                if let Some(d) = tokens.get(j).and_then(|t| match t {
                    Token::Number(n) => divide_number(n, factor),
                    _ => None,
                }) {
                    out.push_str(&lead);
                    out.push_str(&d);
                    i = j + 1;
                }
            }
            other => {
                out.push_str(other.text());
                after_seconds = false;
                i += 1;
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The webhook receiver.

/// One alert of one notification the receiver got.
#[derive(Clone, Debug)]
pub struct Notified {
    /// When it arrived, since the harness started.
    pub at: Duration,
    /// When it arrived.
    pub when: Instant,
    /// The alert's own status: `firing` or `resolved`.
    pub status: String,
    /// Its labels (`alertname` among them).
    pub labels: BTreeMap<String, String>,
    /// Its `startsAt` and `endsAt`, as Alertmanager wrote them.
    pub starts_at: String,
    /// See `starts_at`.
    pub ends_at: String,
}

impl std::fmt::Display for Notified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        write!(
            f,
            "+{:.1}s {} {{{}}} startsAt={} endsAt={}",
            self.at.as_secs_f64(),
            self.status,
            labels.join(", "),
            self.starts_at,
            self.ends_at
        )
    }
}

/// An HTTP server in the test process recording every Alertmanager webhook notification.
struct Receiver {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Notified>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    fn start(started: Instant) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("receiver address");
        let seen: Arc<Mutex<Vec<Notified>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let s = s.clone();
                        // One thread per connection (Alertmanager keeps its connection open);
                        // it ends when Alertmanager closes it.
                        std::thread::spawn(move || serve(conn, &s, started));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Receiver {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Notified> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads HTTP/1.1 requests from `conn` until it closes; each body (Alertmanager's webhook
/// JSON) is recorded, each answered 200.
fn serve(conn: TcpStream, seen: &Mutex<Vec<Notified>>, started: Instant) {
    let _ = conn.set_nonblocking(false);
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            match reader.read_line(&mut header) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.trim().eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let when = Instant::now();
        if let Ok(v) = serde_json::from_slice::<Value>(&body) {
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            for a in v["alerts"].as_array().into_iter().flatten() {
                let labels = a["labels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                s.push(Notified {
                    at: when.duration_since(started),
                    when,
                    status: a["status"].as_str().unwrap_or("").to_string(),
                    labels,
                    starts_at: a["startsAt"].as_str().unwrap_or("").to_string(),
                    ends_at: a["endsAt"].as_str().unwrap_or("").to_string(),
                });
            }
        }
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Prometheus and Alertmanager.

/// A Prometheus scraping the adapters' admin ports and an Alertmanager notifying the receiver;
/// both killed on drop.
pub struct Monitoring {
    prometheus: Process,
    alertmanager: Process,
    /// Prometheus' HTTP address.
    pub prometheus_addr: SocketAddr,
    /// Alertmanager's HTTP address.
    pub alertmanager_addr: SocketAddr,
    receiver: Receiver,
    targets_file: PathBuf,
    started: Instant,
    _dir: tempfile::TempDir,
}

impl Monitoring {
    /// Starts Alertmanager, then Prometheus with `rules` and the admin addresses `targets`
    /// (`instance` is each address as written, `127.0.0.1:PORT`); waits until both are ready.
    pub fn start(rules: &Rules, targets: &[SocketAddr]) -> Monitoring {
        let started = Instant::now();
        let (prometheus_bin, alertmanager_bin) = (prometheus_bin(), alertmanager_bin());
        let dir = tempfile::tempdir().expect("tempdir");
        let receiver = Receiver::start(started);
        let (prometheus_addr, alertmanager_addr) = (free_addr(), free_addr());

        let am_config = dir.path().join("alertmanager.yml");
        std::fs::write(
            &am_config,
            format!(
                "route:\n  receiver: test\n  group_by: [alertname, instance]\n  group_wait: 1s\n  \
                 group_interval: 1s\n  repeat_interval: 24h\nreceivers:\n- name: test\n  \
                 webhook_configs:\n  - url: http://{}/alerts\n    send_resolved: true\n",
                receiver.addr
            ),
        )
        .expect("write alertmanager.yml");
        let alertmanager = Process::new("alertmanager", dir.path(), Duration::from_millis(50));
        alertmanager.spawn(
            Command::new(alertmanager_bin)
                .arg(format!("--config.file={}", am_config.display()))
                .arg(format!(
                    "--storage.path={}",
                    dir.path().join("alertmanager-data").display()
                ))
                .arg(format!("--web.listen-address={alertmanager_addr}"))
                // No gossip: one Alertmanager, notifying at once (no wait for peers to settle).
                .arg("--cluster.listen-address="),
        );
        alertmanager.wait_until(Duration::from_secs(30), "/-/ready 200", || {
            http_get(alertmanager_addr, "/-/ready").is_ok_and(|(s, _)| s == 200)
        });

        let rules_file = dir.path().join("alerts.yaml");
        std::fs::write(&rules_file, &rules.text).expect("write the rules");
        let targets_file = dir.path().join("targets.json");
        write_targets(&targets_file, targets);
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [{rules:?}]\n\
                 alerting:\n  alertmanagers:\n  - static_configs:\n    - targets: [\"{alertmanager_addr}\"]\n\
                 scrape_configs:\n- job_name: {JOB}\n  file_sd_configs:\n  - files: [{targets:?}]\n    refresh_interval: 1s\n",
                rules = rules_file.display().to_string(),
                targets = targets_file.display().to_string(),
            ),
        )
        .expect("write prometheus.yml");
        let prometheus = Process::new("prometheus", dir.path(), Duration::from_millis(50));
        prometheus.spawn(
            Command::new(prometheus_bin)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("prometheus-data").display()
                ))
                .arg(format!("--web.listen-address={prometheus_addr}"))
                .arg("--storage.tsdb.retention.time=1d"),
        );
        prometheus.wait_until(Duration::from_secs(30), "/-/ready 200", || {
            http_get(prometheus_addr, "/-/ready").is_ok_and(|(s, _)| s == 200)
        });
        let m = Monitoring {
            prometheus,
            alertmanager,
            prometheus_addr,
            alertmanager_addr,
            receiver,
            targets_file,
            started,
            _dir: dir,
        };
        // The rules are loaded (a rule file Prometheus refused would leave none).
        let loaded = m.loaded_alerts();
        assert_eq!(
            loaded.len(),
            rules.alerts.len(),
            "Prometheus loaded alerts {loaded:?}, the rule file has {:?}; its log:\n{}",
            rules.alerts,
            m.prometheus.log_tail(30)
        );
        m
    }

    /// Replaces the scrape targets (file service discovery: read within a second).
    pub fn set_targets(&self, targets: &[SocketAddr]) {
        write_targets(&self.targets_file, targets);
    }

    /// The names of the alerting rules Prometheus evaluates.
    pub fn loaded_alerts(&self) -> Vec<String> {
        let (status, body) =
            http_get(self.prometheus_addr, "/api/v1/rules?type=alert").expect("GET /api/v1/rules");
        assert_eq!(status, 200, "/api/v1/rules: {body}");
        let v: Value = serde_json::from_str(&body).expect("rules JSON");
        v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect()
    }

    /// An instant query: the result's series (a scalar or string as one element), or
    /// Prometheus' error.
    pub fn query(&self, q: &str) -> Result<Vec<Value>, String> {
        let path = format!("/api/v1/query?query={}", url_encode(q));
        let (status, body) =
            http_get(self.prometheus_addr, &path).map_err(|e| format!("GET {path}: {e}"))?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| format!("HTTP {status}, not JSON: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or("error"),
                v["error"].as_str().unwrap_or(&body)
            ));
        }
        Ok(match &v["data"]["result"] {
            Value::Array(a)
                if v["data"]["resultType"] == "vector" || v["data"]["resultType"] == "matrix" =>
            {
                a.clone()
            }
            other => vec![other.clone()],
        })
    }

    /// The single value `q` returns, if it returns exactly one sample.
    pub fn value(&self, q: &str) -> Option<f64> {
        let r = self.query(q).ok()?;
        match r.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Waits until Prometheus has scraped `instance` and found it up (`up == 1`).
    pub fn wait_up(&self, instance: SocketAddr, timeout: Duration) {
        let q = format!("up{{job=\"{JOB}\",instance=\"{instance}\"}}");
        let end = Instant::now() + timeout;
        while self.value(&q) != Some(1.0) {
            assert!(
                Instant::now() < end,
                "Prometheus did not find {instance} up within {timeout:?} ({q}: {:?}); targets: {}",
                self.query(&q),
                http_get(self.prometheus_addr, "/api/v1/targets")
                    .map(|(_, b)| b)
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every alert of every notification received so far, in order.
    pub fn notifications(&self) -> Vec<Notified> {
        self.receiver.seen()
    }

    /// The `ALERTS` series now (pending and firing), as `alertname{labels} state` lines.
    pub fn alerts_now(&self) -> Vec<String> {
        match self.query("ALERTS") {
            Ok(series) => series
                .iter()
                .map(|s| {
                    let m = s["metric"].as_object().cloned().unwrap_or_default();
                    let labels: Vec<String> = m
                        .iter()
                        .filter(|(k, _)| *k != "__name__")
                        .map(|(k, v)| format!("{k}={}", v))
                        .collect();
                    format!("{{{}}}", labels.join(", "))
                })
                .collect(),
            Err(e) => vec![format!("(ALERTS query failed: {e})")],
        }
    }

    /// What a failure message shows: every notification received, and `ALERTS` now.
    pub fn report(&self) -> String {
        let got: Vec<String> = self.notifications().iter().map(|n| n.to_string()).collect();
        format!(
            "notifications received ({}):\n  {}\nALERTS now:\n  {}",
            got.len(),
            if got.is_empty() {
                "(none)".to_string()
            } else {
                got.join("\n  ")
            },
            self.alerts_now().join("\n  ")
        )
    }

    /// Waits until Alertmanager has notified alert `name` with `status` (`firing` or
    /// `resolved`) and labels including `labels`, received at or after `since`; that alert.
    /// Panics after `timeout` with everything received and the `ALERTS` series.
    pub fn wait_alert(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        status: &str,
        since: Instant,
        timeout: Duration,
    ) -> Notified {
        let end = Instant::now() + timeout;
        loop {
            if let Some(n) = self.notifications().into_iter().find(|n| {
                n.when >= since
                    && n.status == status
                    && n.labels.get("alertname").map(String::as_str) == Some(name)
                    && labels
                        .iter()
                        .all(|(k, v)| n.labels.get(*k).map(String::as_str) == Some(*v))
            }) {
                return n;
            }
            assert!(
                Instant::now() < end,
                "no {status} notification of {name} {labels:?} within {timeout:?} (since +{:.1}s); {}\n\
                 prometheus log:\n{}",
                since.saturating_duration_since(self.started).as_secs_f64(),
                self.report(),
                self.prometheus.log_tail(10)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// When the harness started (what [`Notified::at`] counts from).
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for Monitoring {
    fn drop(&mut self) {
        self.prometheus.kill();
        self.alertmanager.kill();
    }
}

/// Writes a file service discovery list of `targets`, renamed into place.
fn write_targets(file: &Path, targets: &[SocketAddr]) {
    let list = serde_json::json!([{
        "targets": targets.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        "labels": {},
    }]);
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, list.to_string()).expect("write targets");
    std::fs::rename(&tmp, file).expect("rename targets");
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(e: &str) -> String {
        compress_expr(e, 30)
    }

    #[test]
    fn ranges_subqueries_and_offsets_are_divided() {
        assert_eq!(c("rate(x_total[5m])"), "rate(x_total[10s])");
        assert_eq!(
            c("increase(x_total{a=\"b\"}[10m]) > 0"),
            "increase(x_total{a=\"b\"}[20s]) > 0"
        );
        assert_eq!(c("max_over_time(x[10m:1m])"), "max_over_time(x[20s:2s])");
        assert_eq!(c("max_over_time(x[1h:])"), "max_over_time(x[120s:])");
        assert_eq!(c("x offset 1h"), "x offset 120s");
        assert_eq!(c("rate(x[5m] offset -30m)"), "rate(x[10s] offset -60s)");
        assert_eq!(c("rate(x[1h30m])"), "rate(x[180s])");
        // Not exact in seconds: milliseconds.
        assert_eq!(c("rate(x[7m])"), "rate(x[14s])");
        assert_eq!(c("rate(x[200s])"), "rate(x[6666ms])");
        // No shorter than four scrape intervals.
        assert_eq!(c("rate(x[1m])"), "rate(x[4s])");
        // A subquery's step keeps its ratio.
        assert_eq!(c("max_over_time(x[1m:30s])"), "max_over_time(x[4s:1s])");
    }

    #[test]
    fn a_threshold_on_an_elapsed_time_is_divided_and_nothing_else() {
        assert_eq!(
            c("mcp_adapter_kube_output_lag_seconds > 300"),
            "mcp_adapter_kube_output_lag_seconds > 10"
        );
        assert_eq!(
            c("mcp_adapter_last_good_sync_age_seconds{job=\"mcp-adapters\"} >= 600"),
            "mcp_adapter_last_good_sync_age_seconds{job=\"mcp-adapters\"} >= 20"
        );
        assert_eq!(c("x_seconds > bool 900"), "x_seconds > bool 30");
        assert_eq!(
            c("max by (instance) (x_seconds) > 45"),
            "max by (instance) (x_seconds) > 1.5"
        );
        assert_eq!(
            c("max(x_seconds) by (instance) > 600"),
            "max(x_seconds) by (instance) > 20"
        );
        assert_eq!(c("(time() - x_seconds) > 600"), "(time() - x_seconds) > 20");
        assert_eq!(
            c("max_over_time(x_seconds[5m]) > 300"),
            "max_over_time(x_seconds[10s]) > 10"
        );
        // The product keeps its meaning: (5 / 30) * 60 = 10.
        assert_eq!(c("x_seconds > 5 * 60"), "x_seconds > 0.167 * 60");
        // Not a time: untouched.
        assert_eq!(c("x_total > 300"), "x_total > 300");
        assert_eq!(c("x_seconds_bucket > 300"), "x_seconds_bucket > 300");
        assert_eq!(
            c("histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[5m]))) > 30"),
            "histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[10s]))) > 30"
        );
        // An expiry timestamp minus now is compared after an arithmetic operator: untouched.
        assert_eq!(
            c("mcp_adapter_tls_certificate_not_after_seconds - time() < 14 * 86400"),
            "mcp_adapter_tls_certificate_not_after_seconds - time() < 14 * 86400"
        );
        assert_eq!(c("a_seconds + b > 300"), "a_seconds + b > 300");
        // `and` / `or` end the operand.
        assert_eq!(
            c("x_seconds > 300 and y_total > 300"),
            "x_seconds > 10 and y_total > 300"
        );
        // Strings and comments are left alone.
        assert_eq!(
            c("x{a=\"[5m] > 300\"} # [5m]"),
            "x{a=\"[5m] > 300\"} # [5m]"
        );
        // A brace inside a matcher's string does not end the matchers.
        assert_eq!(c("x_seconds{a=\"}\"} > 300"), "x_seconds{a=\"}\"} > 10");
    }

    #[test]
    fn a_rule_file_has_its_for_and_exprs_compressed() {
        let yaml = "groups:\n- name: g\n  interval: 30s\n  rules:\n  - alert: A\n    expr: rate(x[5m]) > 0\n    for: 10m\n    labels: {severity: warning}\n  - alert: B\n    expr: y_seconds > 600\n  - record: r\n    expr: sum(z)\n";
        let r = Rules::compress(yaml, 30).expect("compress");
        assert_eq!(r.alerts, ["A", "B"]);
        assert_eq!(r.longest_for, Duration::from_secs(20));
        assert_eq!(r.for_of("A"), Duration::from_secs(20));
        assert_eq!(r.for_of("B"), Duration::ZERO);
        assert_eq!(r.offsets["A"], Duration::ZERO);
        let v: Value = serde_json::from_str(&r.text).expect("JSON");
        let rules = &v["groups"][0]["rules"];
        assert_eq!(rules[0]["for"], "20s");
        assert_eq!(rules[0]["expr"], "rate(x[10s]) > 0");
        assert_eq!(rules[0]["labels"]["severity"], "warning");
        assert_eq!(rules[1]["expr"], "y_seconds > 20");
        assert_eq!(rules[2]["expr"], "sum(z)");
        assert!(v["groups"][0].get("interval").is_none());
        let offset = "groups:\n- name: g\n  rules:\n  - alert: H\n    expr: min_over_time(x[1h]) > 2 * min_over_time(x[1h] offset 6h)\n    for: 1h\n";
        let r = Rules::compress(offset, 30).expect("compress");
        assert_eq!(r.offsets["H"], Duration::from_secs(720));
        assert!(Rules::compress(
            "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x\n    for: soon\n",
            30
        )
        .is_err());
    }

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration_ms("1h30m"), Some(5_400_000));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("1d"), Some(86_400_000));
        assert_eq!(parse_duration_ms("5"), None);
        assert_eq!(parse_duration_ms("m"), None);
        assert_eq!(parse_duration_ms(""), None);
        assert_eq!(format_duration_ms(10_000), "10s");
        assert_eq!(format_duration_ms(6_666), "6666ms");
    }

    #[test]
    fn queries_are_url_encoded() {
        assert_eq!(
            url_encode("up{a=\"b\"} > 0"),
            "up%7Ba%3D%22b%22%7D%20%3E%200"
        );
    }
}
