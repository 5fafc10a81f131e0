//! Services shaped like a Kubernetes or Consul registry's, for the benches that size what the
//! adapter holds (`model_size`) or writes (`state_file_size`) and the test that sizes the
//! manifests' state volume from the latter: ten endpoints per service, three
//! labels per endpoint (`app=<service>`, `version=v1|v2`, `zone=a|b|c`, so five distinct label
//! sets per service), a locality per endpoint that follows its zone, a service account per
//! service, a network for one service in four, and an endpoint port mapping on one endpoint in
//! ten.

use crate::model::{Endpoint, Labels, Port, Service, ServiceKey};

/// Endpoints per service.
pub const ENDPOINTS: usize = 10;
const ZONES: [&str; 3] = ["a", "b", "c"];

/// Endpoint `j` of service `i`, built as an adapter's convert code builds it: fresh strings and
/// a fresh label map per endpoint, straight from the registry's data.
fn endpoint(i: usize, j: usize, name: &str) -> Endpoint {
    let zone = ZONES[j % ZONES.len()];
    let n = i * ENDPOINTS + j;
    let mut labels = Labels::new();
    labels.insert("app".into(), name.to_string());
    labels.insert(
        "version".into(),
        if j.is_multiple_of(5) { "v2" } else { "v1" }.to_string(),
    );
    labels.insert("zone".into(), format!("us-east-1{zone}"));
    let mut e = Endpoint {
        address: format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255),
        labels: labels.into(),
        locality: Some(format!("us-east-1/us-east-1{zone}").into()),
        service_account: Some(name.to_string().into()),
        network: i.is_multiple_of(4).then(|| "network-1".to_string().into()),
        ..Default::default()
    };
    if j == 9 {
        e.ports = [("http".to_string(), 8081)].into_iter().collect();
    }
    e
}

/// Service `i`: `svc-<i>`, one HTTP port, [`ENDPOINTS`] endpoints.
pub fn service(i: usize) -> Service {
    let name = format!("svc-{i:06}");
    let mut s = Service::new(ServiceKey::new(&name), format!("bench service {name}"));
    s.ports.push(Port {
        number: 8080,
        name: "http".into(),
        protocol: Some("HTTP".into()),
        target_port: None,
    });
    s.endpoints = (0..ENDPOINTS).map(|j| endpoint(i, j, &name)).collect();
    s
}

/// Services `0..services`.
pub fn model(services: usize) -> Vec<Service> {
    (0..services).map(service).collect()
}
