//! Nacos' JSON, as far as the adapter reads it: the 2.x gRPC bodies (subscription answers and
//! pushes carry a [`ServiceInfo`], service lists a [`ServiceNames`]) and the HTTP answers
//! (login, namespaces, the catalog of 2.x and the service list of 3.x's admin API).
//!
//! Fields are optional or defaulted wherever Nacos versions differ (2.x sends `allIPs`, 3.x
//! `allIps`; `triggerFlag` is a bool or a string; older servers leave out `ephemeral`), so that an
//! answer is only refused for what the adapter needs. One instance that cannot be read does not
//! spoil its service: [`ServiceInfo::hosts`] keeps it as an error naming it, and the others are
//! served.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Nacos' name for the group a service is in when none is given.
pub const DEFAULT_GROUP: &str = "DEFAULT_GROUP";
/// The id of Nacos' default namespace as its clients send it (`Constants.DEFAULT_NAMESPACE_ID`).
/// The 2.x console lists it with the empty id, which 2.x's HTTP API takes for it too; over gRPC
/// only `public` finds its services.
pub const PUBLIC: &str = "public";

/// The namespace id the adapter uses for `ns` as a server or a user wrote it: the empty id is
/// `public`.
pub fn namespace_id(ns: &str) -> String {
    let ns = ns.trim();
    if ns.is_empty() {
        PUBLIC.to_string()
    } else {
        ns.to_string()
    }
}

/// One instance of a service.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Instance {
    /// Nacos' id (`ip#port#cluster#group@@service`); not every server sends it.
    pub instance_id: Option<String>,
    /// Address as registered (not checked by Nacos).
    pub ip: String,
    /// Port as registered.
    pub port: i64,
    /// Weight, `1.0` by default; `0` takes the instance out of Nacos clients' load balancing.
    pub weight: f64,
    /// The server's health verdict (heartbeats or health checks).
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Whether the instance takes traffic (an operator's switch).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Ephemeral (lives with its client's connection) or persistent.
    pub ephemeral: bool,
    /// The cluster within the service (`DEFAULT` unless the client names one).
    pub cluster_name: Option<String>,
    /// Flat string map: Dubbo and Spring Cloud Alibaba put `version`, `protocol`, `secure`,
    /// `management.port`, `dubbo.endpoints`, `preserved.*` here.
    pub metadata: BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

/// An instance as the server sent it: read, or why not (with what identifies it).
pub type Host = Result<Instance, String>;

/// A service's instances as the server pushes them (each push is the whole list).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceInfo {
    /// The service name; some servers send `GROUP@@name`.
    pub name: Option<String>,
    /// The group.
    pub group_name: Option<String>,
    /// Every instance (all health states; the adapter filters), each read on its own.
    #[serde(deserialize_with = "hosts")]
    pub hosts: Vec<Host>,
}

impl ServiceInfo {
    /// An empty list for `group`/`name` (a subscription answered without one).
    pub fn empty(group: &str, name: &str) -> Self {
        Self {
            name: Some(name.to_string()),
            group_name: Some(group.to_string()),
            hosts: Vec::new(),
        }
    }

    /// `(group, name)` of the service, the group defaulted and a `GROUP@@` prefix split off.
    pub fn group_and_name(&self) -> (String, String) {
        let group = self
            .group_name
            .as_deref()
            .filter(|g| !g.is_empty())
            .unwrap_or(DEFAULT_GROUP);
        let (g, n) = split_grouped(self.name.as_deref().unwrap_or_default(), group);
        (g.to_string(), n.to_string())
    }
}

/// Reads each element of `hosts` on its own, so one bad instance is an error in its place.
fn hosts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Host>, D::Error> {
    let raw: Option<Vec<Value>> = Option::deserialize(d)?;
    Ok(raw
        .unwrap_or_default()
        .into_iter()
        .map(|v| {
            let who = match (v.get("ip"), v.get("port")) {
                (Some(ip), Some(port)) => format!("{ip}:{port}"),
                _ => mcp_core::clip::clip(&v.to_string(), 120).to_string(),
            };
            serde_json::from_value::<Instance>(v)
                .map_err(|e| format!("instance {who} cannot be read: {e}"))
        })
        .collect())
}

/// The envelope of every 2.x gRPC response body.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResponseBody {
    /// 200 on success, 500 on failure.
    pub result_code: u16,
    /// The failure's code (403 no permission, 301 unknown connection).
    pub error_code: u16,
    /// The failure's message.
    pub message: Option<String>,
    /// `ServerCheckResponse`: the connection's id on the server.
    pub connection_id: Option<String>,
    /// `SubscribeServiceResponse`: the service as it is now.
    pub service_info: Option<ServiceInfo>,
}

/// `ServiceListResponse`: one page of one group's service names.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceNames {
    /// How many services the group has in all.
    pub count: u64,
    /// This page's names (without the group).
    pub service_names: Vec<String>,
}

/// What the adapter reads of a request the server sends on the connection's stream (a push,
/// `NotifySubscriberRequest`, or a connection request: `ClientDetectionRequest`,
/// `ConnectResetRequest`).
#[derive(Clone, Debug, Default)]
pub struct ServerRequest {
    /// Echoed in the answer.
    pub request_id: Option<String>,
    /// The pushed service, or why it cannot be read (with the service's name when that much
    /// could be read).
    pub service_info: Option<Result<ServiceInfo, UnreadablePush>>,
}

/// A push whose service could not be read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnreadablePush {
    /// `(group, name)`, when the body names them.
    pub service: Option<(String, String)>,
    /// What was wrong.
    pub error: String,
}

impl ServerRequest {
    /// Reads a request body: the id whenever the body is a JSON object, the service on its own.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let request_id = match v.get("requestId") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let service_info = v.get("serviceInfo").filter(|s| !s.is_null()).map(|s| {
            ServiceInfo::deserialize(s).map_err(|e| {
                let text = |k: &str| s.get(k).and_then(Value::as_str).map(str::to_string);
                let service = text("name").map(|name| {
                    let group = text("groupName")
                        .filter(|g| !g.is_empty())
                        .unwrap_or_else(|| DEFAULT_GROUP.to_string());
                    let (g, n) = split_grouped(&name, &group);
                    (g.to_string(), n.to_string())
                });
                UnreadablePush {
                    service,
                    error: e.to_string(),
                }
            })
        });
        Ok(Self {
            request_id,
            service_info,
        })
    }
}

/// `POST /nacos/v1/auth/login` (and 3.x's `/nacos/v3/auth/user/login`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Login {
    /// Sent as `accessToken` on every request.
    pub access_token: String,
    /// Seconds the token is valid (18000 by default in Nacos).
    #[serde(default)]
    pub token_ttl: Option<u64>,
}

/// `GET /nacos/v1/console/namespaces` (2.x) and `GET /nacos/v3/admin/core/namespace/list` (3.x).
#[derive(Clone, Debug, Deserialize)]
pub struct Namespaces {
    /// One entry per namespace.
    #[serde(default)]
    pub data: Vec<Namespace>,
}

/// One namespace.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespace {
    /// Its id (2.x: empty for `public`; 3.x: `public`).
    #[serde(default)]
    pub namespace: String,
}

/// `GET /nacos/v1/ns/catalog/services` (2.x): one page of the services of a namespace, every
/// group.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CatalogPage {
    /// How many services match in all.
    pub count: u64,
    /// This page.
    pub service_list: Vec<CatalogService>,
}

/// `GET /nacos/v3/admin/ns/service/list` (3.x): `{code, message, data: {totalCount,
/// pageItems}}`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct AdminServicePage {
    /// 0 on success.
    pub code: i64,
    /// The failure's message.
    pub message: Option<String>,
    /// The page.
    pub data: AdminServices,
}

/// The page of an [`AdminServicePage`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AdminServices {
    /// How many services match in all.
    pub total_count: u64,
    /// This page.
    pub page_items: Vec<CatalogService>,
}

/// One catalog entry: names only.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CatalogService {
    /// Service name.
    pub name: String,
    /// Its group.
    pub group_name: Option<String>,
}

impl CatalogService {
    /// `(group, name)`, the group defaulted and a `GROUP@@` prefix split off.
    pub fn group_and_name(&self) -> (String, String) {
        let group = self
            .group_name
            .as_deref()
            .filter(|g| !g.is_empty())
            .unwrap_or(DEFAULT_GROUP);
        let (g, n) = split_grouped(&self.name, group);
        (g.to_string(), n.to_string())
    }
}

/// Splits `GROUP@@name` (how Nacos writes a grouped name); a plain name is in `default_group`.
pub fn split_grouped<'a>(name: &'a str, default_group: &'a str) -> (&'a str, &'a str) {
    match name.split_once("@@") {
        Some((g, n)) => (g, n),
        None => (default_group, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_push_as_nacos_sends_it() {
        let body = br#"{"requestId":"7","module":"naming","headers":{},"serviceInfo":{
            "name":"DEFAULT_GROUP@@orders","groupName":"DEFAULT_GROUP","clusters":"",
            "cacheMillis":10000,"lastRefTime":1,"checksum":"x","allIPs":false,
            "reachProtectionThreshold":false,"valid":true,
            "hosts":[{"instanceId":"10.0.0.1#8080#DEFAULT#DEFAULT_GROUP@@orders","ip":"10.0.0.1",
              "port":8080,"weight":2.5,"healthy":false,"enabled":true,"ephemeral":true,
              "clusterName":"DEFAULT","serviceName":"DEFAULT_GROUP@@orders",
              "metadata":{"version":"v2"},"instanceHeartBeatInterval":5000}]}}"#;
        let r = ServerRequest::parse(body).expect("push");
        assert_eq!(r.request_id.as_deref(), Some("7"));
        let info = r.service_info.expect("service info").expect("readable");
        let i = info.hosts[0].as_ref().expect("instance");
        assert_eq!((i.ip.as_str(), i.port, i.weight), ("10.0.0.1", 8080, 2.5));
        assert!(!i.healthy && i.enabled && i.ephemeral);
        assert_eq!(i.metadata.get("version").map(String::as_str), Some("v2"));
        assert_eq!(
            info.group_and_name(),
            ("DEFAULT_GROUP".to_string(), "orders".to_string())
        );
        assert_eq!(split_grouped("orders", "G"), ("G", "orders"));
    }

    #[test]
    fn one_bad_instance_is_an_error_in_its_place_and_the_rest_are_read() {
        let body = br#"{"requestId":"8","serviceInfo":{"name":"orders","groupName":"G","hosts":[
            {"ip":"10.0.0.1","port":"eighty","weight":1.0},
            {"ip":"10.0.0.2","port":8080,"weight":1.0}]}}"#;
        let info = ServerRequest::parse(body)
            .expect("push")
            .service_info
            .expect("service")
            .expect("readable");
        assert_eq!(info.hosts.len(), 2);
        let bad = info.hosts[0].as_ref().expect_err("bad port");
        assert!(bad.contains("10.0.0.1") && bad.contains("eighty"), "{bad}");
        assert_eq!(info.hosts[1].as_ref().expect("good").ip, "10.0.0.2");
    }

    #[test]
    fn an_unreadable_service_keeps_its_request_id_and_its_name() {
        let body = br#"{"requestId":"9","serviceInfo":{"name":"SHOP@@cart","hosts":"nope"}}"#;
        let r = ServerRequest::parse(body).expect("an object");
        assert_eq!(r.request_id.as_deref(), Some("9"));
        let bad = r.service_info.expect("service").expect_err("unreadable");
        assert_eq!(bad.service, Some(("SHOP".into(), "cart".into())));
        assert!(!bad.error.is_empty());
        assert!(ServerRequest::parse(b"not json").is_err());
    }

    #[test]
    fn catalog_pages_of_both_lines() {
        for flag in ["false", r#""false""#] {
            let body = format!(
                r#"{{"count":1,"serviceList":[{{"name":"a","groupName":"G","ipCount":1,"triggerFlag":{flag}}}]}}"#
            );
            let p: CatalogPage = serde_json::from_str(&body).expect("catalog");
            assert_eq!(
                p.service_list[0].group_and_name(),
                ("G".to_string(), "a".to_string())
            );
        }
        // As Nacos 3.0.3 answers /nacos/v3/admin/ns/service/list.
        let v3 = r#"{"code":0,"message":"success","data":{"totalCount":2,"pageNumber":1,
            "pagesAvailable":1,"pageItems":[{"name":"orders","groupName":"DEFAULT_GROUP",
            "clusterCount":1,"ipCount":1,"healthyInstanceCount":1,"triggerFlag":"false"},
            {"name":"cart","groupName":"SHOP"}]}}"#;
        let p: AdminServicePage = serde_json::from_str(v3).expect("v3 page");
        assert_eq!((p.code, p.data.total_count), (0, 2));
        assert_eq!(
            p.data.page_items[1].group_and_name(),
            ("SHOP".to_string(), "cart".to_string())
        );
        assert_eq!(namespace_id(""), "public");
        assert_eq!(namespace_id(" dev "), "dev");
    }
}
