//! Output: ServiceEntries as Istio JSON/YAML objects and as a `kubectl get`-style table.
//!
//! The spec JSON is `mcp_core::cache::json` (protojson, as a Go client prints it), the same
//! renderer the adapters' Kubernetes output applies.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

pub use mcp_core::cache::json::{location_name, resolution_name, spec_json, API_VERSION};
use serde_json::{json, Map, Value};

use crate::sink::Received;

fn put_str(m: &mut Map<String, Value>, key: &str, v: &str) {
    if !v.is_empty() {
        m.insert(key.to_string(), Value::String(v.to_string()));
    }
}

/// The whole object, as `kubectl get serviceentry -o json` prints it. Empty labels, annotations
/// and namespace are omitted, as the Kubernetes API does.
pub fn object_json(r: &Received) -> Value {
    let mut meta = Map::new();
    meta.insert("name".to_string(), Value::String(r.short_name.clone()));
    put_str(&mut meta, "namespace", &r.namespace);
    if !r.labels.is_empty() {
        meta.insert("labels".to_string(), json!(r.labels));
    }
    if !r.annotations.is_empty() {
        meta.insert("annotations".to_string(), json!(r.annotations));
    }
    if let Some(t) = r.create_time {
        meta.insert("creationTimestamp".to_string(), Value::String(rfc3339(t)));
    }
    put_str(&mut meta, "resourceVersion", &r.version);
    json!({
        "apiVersion": API_VERSION,
        "kind": "ServiceEntry",
        "metadata": meta,
        "spec": spec_json(&r.spec),
    })
}

/// The objects of `state` in name order.
pub fn items_json(state: &BTreeMap<String, Received>) -> Vec<Value> {
    state.values().map(object_json).collect()
}

/// `state` as a Kubernetes `List`, like `kubectl get -o json` prints several objects.
pub fn list_json(state: &BTreeMap<String, Received>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": items_json(state),
    })
}

/// Column headers of [`table`].
pub const TABLE_HEADERS: [&str; 8] = [
    "NAMESPACE",
    "NAME",
    "HOSTS",
    "PORTS",
    "LOCATION",
    "RESOLUTION",
    "ENDPOINTS",
    "VERSION",
];

fn or_none(s: String) -> String {
    if s.is_empty() {
        "<none>".to_string()
    } else {
        s
    }
}

fn row(r: &Received) -> [String; 8] {
    let ports = r
        .spec
        .ports
        .iter()
        .map(|p| {
            if p.protocol.is_empty() {
                p.number.to_string()
            } else {
                format!("{}/{}", p.number, p.protocol)
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    [
        or_none(r.namespace.clone()),
        r.short_name.clone(),
        or_none(r.spec.hosts.join(",")),
        or_none(ports),
        location_name(r.spec.location),
        resolution_name(r.spec.resolution),
        r.spec.endpoints.len().to_string(),
        or_none(r.version.clone()),
    ]
}

/// `state` as an aligned table, one line per ServiceEntry in `namespace/name` order, columns
/// separated by at least three spaces as kubectl does, no trailing spaces. Always has the header
/// line, so an empty state is visibly empty rather than blank.
pub fn table(state: &BTreeMap<String, Received>) -> String {
    let header = TABLE_HEADERS.map(str::to_string);
    let rows: Vec<[String; 8]> = std::iter::once(header)
        .chain(state.values().map(row))
        .collect();
    let mut widths = [0usize; 8];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < r.len() {
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Seconds and nanoseconds since the epoch; negative seconds for earlier times.
fn split(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() == 0 {
                (-secs, 0)
            } else {
                (-secs - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

/// Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days`), so timestamps
/// need no date crate.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    // Both are small and positive by construction.
    (y, m as u32, d as u32)
}

fn date_time(secs: i64) -> String {
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// RFC 3339 UTC with exactly three fractional digits, e.g. `2026-11-22T15:04:05.123Z` (the
/// `--watch` timestamps: fixed width so lines align).
pub fn rfc3339_millis(t: SystemTime) -> String {
    let (secs, nanos) = split(t);
    format!("{}.{:03}Z", date_time(secs), nanos / 1_000_000)
}

/// RFC 3339 UTC with as many fractional digits as needed and none for whole seconds (Go's
/// `RFC3339Nano`): whole seconds match Kubernetes' `creationTimestamp`, and sub-second times
/// match what Go clients of an MCP server print.
pub fn rfc3339(t: SystemTime) -> String {
    let (secs, nanos) = split(t);
    if nanos == 0 {
        format!("{}Z", date_time(secs))
    } else {
        let frac = format!("{nanos:09}");
        format!("{}.{}Z", date_time(secs), frac.trim_end_matches('0'))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mcp_core::testing::filled_service_entry as filled;
    use proto::istio::networking::v1alpha3::ServiceEntry;
    use std::time::Duration;

    fn received(name: &str, spec: ServiceEntry) -> Received {
        let (ns, short) = name.split_once('/').unwrap();
        Received {
            name: name.into(),
            namespace: ns.into(),
            short_name: short.into(),
            version: "v1".into(),
            create_time: Some(UNIX_EPOCH + Duration::from_millis(1_704_164_645_006)),
            labels: [("app".to_string(), "x".to_string())].into(),
            annotations: BTreeMap::new(),
            spec,
        }
    }

    #[test]
    fn object_json_has_metadata() {
        let r = received("default/foo", ServiceEntry::default());
        assert_eq!(
            object_json(&r),
            json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": "ServiceEntry",
                "metadata": {
                    "name": "foo",
                    "namespace": "default",
                    "labels": {"app": "x"},
                    "creationTimestamp": "2024-01-02T03:04:05.006Z",
                    "resourceVersion": "v1"
                },
                "spec": {}
            })
        );
    }

    #[test]
    fn table_is_aligned() {
        let mut state = BTreeMap::new();
        state.insert("default/foo".to_string(), received("default/foo", filled()));
        let mut short = received(
            "a/b",
            ServiceEntry {
                hosts: vec!["b".into()],
                ..Default::default()
            },
        );
        short.version = String::new();
        state.insert("a/b".to_string(), short);
        let out = table(&state);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            "NAMESPACE   NAME   HOSTS                              PORTS             LOCATION        RESOLUTION        ENDPOINTS   VERSION"
        );
        assert_eq!(
            lines[1],
            "a           b      b                                  <none>            MESH_EXTERNAL   NONE              0           <none>"
        );
        assert_eq!(
            lines[2],
            "default     foo    api.example.com,api2.example.com   443/TLS,80/HTTP   MESH_INTERNAL   DNS_ROUND_ROBIN   2           v1"
        );
        // Every column starts at the same offset on every line.
        for h in &TABLE_HEADERS[1..] {
            let col = lines[0].find(&format!(" {h}")).unwrap() + 1;
            for l in &lines[1..] {
                assert_ne!(l.as_bytes()[col], b' ', "column {h} in {l:?}");
                assert_eq!(l.as_bytes()[col - 1], b' ', "column {h} in {l:?}");
            }
        }
        assert_eq!(table(&BTreeMap::new()).lines().count(), 1);
    }

    #[test]
    fn timestamps() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_359_845_123);
        assert_eq!(rfc3339_millis(t), "2026-11-22T15:04:05.123Z");
        assert_eq!(rfc3339(t), "2026-11-22T15:04:05.123Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::new(1_704_164_645, 6_000)),
            "2024-01-02T03:04:05.000006Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_millis(1)),
            "1969-12-31T23:59:59.999Z"
        );
    }
}
