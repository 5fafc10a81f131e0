//! Nacos' JSON, as far as the adapter reads it: the 2.x gRPC bodies (subscription answers and
//! pushes carry a [`ServiceInfo`]) and the Open API answers (login, namespaces, the catalog).
//!
//! Fields are optional or defaulted wherever Nacos versions differ (rnacos and Nacos 2.x send
//! `triggerFlag` as a bool and a string; older servers leave out `ephemeral`), so that an answer
//! is only refused for what the adapter needs.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Nacos' name for the group a service is in when none is given.
pub const DEFAULT_GROUP: &str = "DEFAULT_GROUP";
/// The namespace id of `public`, Nacos' default namespace: the empty string (Nacos 2.x also
/// accepts "public" for it).
pub const PUBLIC: &str = "";

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

/// A service's instances as the server pushes them (each push is the whole list).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceInfo {
    /// The service name; some servers send `GROUP@@name`.
    pub name: Option<String>,
    /// The group.
    pub group_name: Option<String>,
    /// Every instance (all health states; the adapter filters).
    pub hosts: Vec<Instance>,
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

/// A push from the server (`NotifySubscriberRequest`) or one of its connection requests
/// (`ClientDetectionRequest`, `ConnectResetRequest`): what the adapter reads of them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServerRequest {
    /// Echoed in the answer.
    pub request_id: Option<String>,
    /// The pushed service (`NotifySubscriberRequest`).
    pub service_info: Option<ServiceInfo>,
}

/// `POST /nacos/v1/auth/login`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Login {
    /// Sent as `accessToken` on every request.
    pub access_token: String,
    /// Seconds the token is valid (18000 by default in Nacos).
    #[serde(default)]
    pub token_ttl: Option<u64>,
}

/// `GET /nacos/v1/console/namespaces`.
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
    /// Its id (empty for `public`).
    #[serde(default)]
    pub namespace: String,
}

/// `GET /nacos/v1/ns/catalog/services`: one page of the services of a namespace, every group.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CatalogPage {
    /// How many services match in all.
    pub count: u64,
    /// This page.
    pub service_list: Vec<CatalogService>,
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
    fn reads_a_push_as_nacos_and_rnacos_send_it() {
        let body = r#"{"requestId":"7","module":"naming","headers":{},"serviceInfo":{
            "name":"DEFAULT_GROUP@@orders","groupName":"DEFAULT_GROUP","clusters":"",
            "cacheMillis":10000,"lastRefTime":1,"checksum":"x","allIPs":false,
            "reachProtectionThreshold":false,"valid":true,
            "hosts":[{"instanceId":"10.0.0.1#8080#DEFAULT#DEFAULT_GROUP@@orders","ip":"10.0.0.1",
              "port":8080,"weight":2.5,"healthy":false,"enabled":true,"ephemeral":true,
              "clusterName":"DEFAULT","serviceName":"DEFAULT_GROUP@@orders",
              "metadata":{"version":"v2"},"instanceHeartBeatInterval":5000}]}}"#;
        let r: ServerRequest = serde_json::from_str(body).expect("push");
        assert_eq!(r.request_id.as_deref(), Some("7"));
        let info = r.service_info.expect("service info");
        let i = &info.hosts[0];
        assert_eq!((i.ip.as_str(), i.port, i.weight), ("10.0.0.1", 8080, 2.5));
        assert!(!i.healthy && i.enabled && i.ephemeral);
        assert_eq!(i.metadata.get("version").map(String::as_str), Some("v2"));
        assert_eq!(
            split_grouped(info.name.as_deref().unwrap_or(""), DEFAULT_GROUP),
            ("DEFAULT_GROUP", "orders")
        );
        assert_eq!(split_grouped("orders", "G"), ("G", "orders"));
    }

    #[test]
    fn a_catalog_entry_with_either_trigger_flag() {
        for flag in ["false", r#""false""#] {
            let body = format!(
                r#"{{"count":1,"serviceList":[{{"name":"a","groupName":"G","ipCount":1,"triggerFlag":{flag}}}]}}"#
            );
            let p: CatalogPage = serde_json::from_str(&body).expect("catalog");
            assert_eq!(p.service_list[0].name, "a");
            assert_eq!(p.service_list[0].group_name.as_deref(), Some("G"));
        }
    }
}
