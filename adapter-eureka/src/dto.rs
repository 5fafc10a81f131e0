//! Eureka's JSON as its Jackson codec writes it (`GET /apps`, `/apps/delta`).
//!
//! Parsed leniently where old servers differ: the legacy XStream/Jettison codec writes a
//! one-element list as a bare object and numbers as strings, so both forms are accepted for
//! `application`, `instance` and the port `$`. Unknown fields are ignored.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer};

/// The root object: `{"applications": {...}}`.
#[derive(Clone, Debug, Deserialize)]
pub struct Root {
    /// The registry (or delta).
    pub applications: Applications,
}

/// A registry or a delta.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Applications {
    /// Reconcile hash of the server's FULL registry (`DOWN_1_UP_3_`).
    #[serde(rename = "apps__hashcode", default)]
    pub apps_hashcode: Option<String>,
    /// Applications.
    #[serde(rename = "application", default, deserialize_with = "one_or_many")]
    pub application: Vec<Application>,
}

/// One application.
#[derive(Clone, Debug, Deserialize)]
pub struct Application {
    /// App name (upper-cased by the server).
    pub name: String,
    /// Its instances.
    #[serde(rename = "instance", default, deserialize_with = "one_or_many")]
    pub instance: Vec<Instance>,
}

/// One instance.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// Instance id (may be absent on old clients: then the host name is the id).
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Host name.
    #[serde(default)]
    pub host_name: String,
    /// App name.
    #[serde(default)]
    pub app: String,
    /// IP address (not checked by Eureka: anything a client sent).
    #[serde(default)]
    pub ip_addr: String,
    /// Status the server computed (`UP`, `DOWN`, ...).
    #[serde(default)]
    pub status: String,
    /// Status set by an operator (`UNKNOWN` = none). Legacy spelling accepted.
    #[serde(default, alias = "overriddenstatus")]
    pub overridden_status: Option<String>,
    /// Plain port.
    #[serde(default)]
    pub port: Option<PortInfo>,
    /// TLS port.
    #[serde(default)]
    pub secure_port: Option<PortInfo>,
    /// Virtual host name(s), comma-separated.
    #[serde(default)]
    pub vip_address: Option<String>,
    /// Where the instance runs.
    #[serde(default)]
    pub data_center_info: Option<DataCenterInfo>,
    /// Free-form metadata. An empty map arrives as `{"@class": ...}`: that key is dropped.
    #[serde(default)]
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// `ADDED`, `MODIFIED` or `DELETED` (meaningful in a delta).
    #[serde(default)]
    pub action_type: Option<String>,
    /// The server's lease of the instance: when it registered and first went UP there.
    #[serde(default)]
    pub lease_info: Option<LeaseInfo>,
}

/// `{"registrationTimestamp": 1700000000000, "serviceUpTimestamp": ..., ...}`: milliseconds
/// since the epoch, stamped by the server that holds the lease (0 = not yet). Renewal and
/// eviction times are not read: they move with every heartbeat and say nothing about the
/// service.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseInfo {
    /// When the server created this lease: at the instance's registration, and again at every
    /// re-registration (a Eureka client re-registers whenever its instance info changes).
    #[serde(default, deserialize_with = "number_or_string")]
    pub registration_timestamp: Option<u64>,
    /// When the instance first went UP on this server; kept across re-registrations.
    #[serde(default, deserialize_with = "number_or_string")]
    pub service_up_timestamp: Option<u64>,
}

/// `{"$": 8080, "@enabled": "true"}`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PortInfo {
    /// Port number (number or string).
    #[serde(rename = "$", default, deserialize_with = "number_or_string")]
    pub port: Option<u64>,
    /// `"true"` or `"false"` (a string; a boolean accepted too).
    #[serde(rename = "@enabled", default, deserialize_with = "bool_or_string")]
    pub enabled: bool,
}

/// `{"@class": "...AmazonInfo", "name": "Amazon", "metadata": {...}}`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DataCenterInfo {
    /// `MyOwn`, `Amazon`, `Netflix`.
    #[serde(default)]
    pub name: String,
    /// Amazon metadata (`availability-zone`, `instance-id`, ...).
    #[serde(default)]
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl Instance {
    /// Eureka's instance id: `instanceId`, else the Amazon instance id, else the host name.
    pub fn id(&self) -> String {
        if let Some(id) = self.instance_id.as_deref().filter(|s| !s.is_empty()) {
            return id.to_string();
        }
        if let Some(id) = self
            .data_center_info
            .as_ref()
            .and_then(|d| d.metadata.get("instance-id"))
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
        {
            return id.to_string();
        }
        self.host_name.clone()
    }

    /// The status that decides whether it is served: an operator's override, when set, wins.
    pub fn effective_status(&self) -> &str {
        match self.overridden_status.as_deref() {
            Some(s) if !s.is_empty() && s != "UNKNOWN" => s,
            _ => &self.status,
        }
    }

    /// Since when the serving Eureka server has this instance: the time it first went UP there,
    /// else (never UP yet) its registration. Not the earlier of the two: the registration time
    /// is replaced whenever the client registers again (on any change of its instance info),
    /// and the first-UP time, stamped a moment after the first registration, is what survives
    /// that; taking the minimum would move by that moment at the first re-registration.
    pub fn known_since(&self) -> Option<SystemTime> {
        let lease = self.lease_info.as_ref()?;
        let set = |t: Option<u64>| t.filter(|ms| *ms > 0);
        set(lease.service_up_timestamp)
            .or(set(lease.registration_timestamp))
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// Metadata as strings, without Jackson's `@class` marker.
    pub fn metadata_strings(&self) -> BTreeMap<String, String> {
        self.metadata
            .iter()
            .filter(|(k, _)| !k.starts_with('@'))
            .map(|(k, v)| (k.clone(), value_string(v)))
            .collect()
    }
}

/// Reads an answer of `/apps` or `/apps/delta`: the one place Eureka's JSON is decoded, public
/// so that the fuzz targets feed it exactly what the watch does.
pub fn decode(body: &[u8]) -> Result<Applications, serde_json::Error> {
    serde_json::from_slice::<Root>(body).map(|r| r.applications)
}

/// A JSON scalar as text (strings without quotes).
pub fn value_string(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn one_or_many<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany<T> {
        Many(Vec<T>),
        One(T),
        Null(()),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::Many(v) => v,
        OneOrMany::One(t) => vec![t],
        OneOrMany::Null(()) => Vec::new(),
    })
}

fn number_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    })
}

fn bool_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Bool(b) => b,
        serde_json::Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_jackson_and_legacy_shapes() {
        let jackson = r#"{"applications":{"versions__delta":"1","apps__hashcode":"UP_1_",
          "application":[{"name":"ORDERS","instance":[{"instanceId":"h:orders:8080",
          "hostName":"h","app":"ORDERS","ipAddr":"10.0.0.5","status":"UP",
          "overriddenStatus":"UNKNOWN","port":{"$":8080,"@enabled":"true"},
          "securePort":{"$":443,"@enabled":"false"},"vipAddress":"orders",
          "dataCenterInfo":{"@class":"x","name":"MyOwn"},
          "metadata":{"@class":"java.util.Collections$EmptyMap"},"actionType":"ADDED"}]}]}}"#;
        let r: Root = serde_json::from_str(jackson).expect("jackson");
        let i = &r.applications.application[0].instance[0];
        assert_eq!(r.applications.apps_hashcode.as_deref(), Some("UP_1_"));
        assert_eq!(i.id(), "h:orders:8080");
        assert_eq!(i.effective_status(), "UP");
        assert_eq!(i.port.as_ref().and_then(|p| p.port), Some(8080));
        assert!(i.port.as_ref().is_some_and(|p| p.enabled));
        assert!(!i.secure_port.as_ref().is_some_and(|p| p.enabled));
        assert!(i.metadata_strings().is_empty());

        let legacy = r#"{"applications":{"application":{"name":"A","instance":
          {"hostName":"h2","app":"A","ipAddr":"10.0.0.6","status":"UP",
          "overriddenstatus":"OUT_OF_SERVICE","port":{"$":"81","@enabled":true}}}}}"#;
        let r: Root = serde_json::from_str(legacy).expect("legacy");
        let i = &r.applications.application[0].instance[0];
        assert_eq!(i.id(), "h2");
        assert_eq!(i.effective_status(), "OUT_OF_SERVICE");
        assert_eq!(i.port.as_ref().and_then(|p| p.port), Some(81));

        let empty: Root =
            serde_json::from_str(r#"{"applications":{"apps__hashcode":"","application":[]}}"#)
                .expect("empty");
        assert!(empty.applications.application.is_empty());
    }

    #[test]
    fn known_since_is_the_first_up_else_the_registration() {
        let at = |json: &str| {
            let i: Instance = serde_json::from_str(json).expect("instance");
            i.known_since().map(|t| {
                t.duration_since(UNIX_EPOCH)
                    .expect("after 1970")
                    .as_millis()
            })
        };
        // Re-registered after it went UP: the first UP is kept.
        assert_eq!(
            at(r#"{"leaseInfo":{"registrationTimestamp":1700000009000,
                "serviceUpTimestamp":1700000001000,"lastRenewalTimestamp":1700000099000}}"#),
            Some(1_700_000_001_000)
        );
        // UP a millisecond after registering: the UP time, which a re-registration keeps.
        assert_eq!(
            at(r#"{"leaseInfo":{"registrationTimestamp":1700000000999,
                "serviceUpTimestamp":1700000001000}}"#),
            Some(1_700_000_001_000)
        );
        // Never UP (0), legacy string numbers.
        assert_eq!(
            at(
                r#"{"leaseInfo":{"registrationTimestamp":"1700000002000","serviceUpTimestamp":"0"}}"#
            ),
            Some(1_700_000_002_000)
        );
        assert_eq!(at(r#"{"leaseInfo":{}}"#), None);
        assert_eq!(at("{}"), None);
    }
}
