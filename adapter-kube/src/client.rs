//! Connecting to the API server the way kubectl does, and saying what a failed request means.

use kube::Client;
use mcp_core::RegistryError;

use crate::config::KubeConfig;

pub use mcp_core::kube_output::ClientError;

/// A client for the cluster the flags name (kubectl's order; the same code as the Kubernetes
/// output's).
pub async fn connect(cfg: &KubeConfig) -> Result<Client, ClientError> {
    mcp_core::kube_output::connect(cfg.kubeconfig.as_deref(), cfg.context.as_deref()).await
}

/// What the adapter was doing when a request failed, for the error message.
#[derive(Clone, Debug)]
pub struct Activity {
    /// Plural resource with its group (`services`, `endpointslices.discovery.k8s.io`).
    pub resource: &'static str,
    /// `None` = all namespaces.
    pub namespace: Option<String>,
}

impl std::fmt::Display for Activity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "list/watch {} in namespace {ns}", self.resource),
            None => write!(f, "list/watch {} in all namespaces", self.resource),
        }
    }
}

/// The error a failed watch ends with, or `None` when the watcher recovers by itself (410 Gone:
/// the resource version expired and the watcher lists again).
pub fn classify(err: &kube::runtime::watcher::Error, what: &Activity) -> Option<RegistryError> {
    use kube::runtime::watcher::Error as W;
    let status = match err {
        W::InitialListFailed(kube::Error::Api(s))
        | W::WatchStartFailed(kube::Error::Api(s))
        | W::WatchFailed(kube::Error::Api(s)) => Some(s.as_ref()),
        W::WatchError(s) => Some(s.as_ref()),
        _ => None,
    };
    match status {
        Some(s) if s.code == 410 => None,
        Some(s) if s.code == 401 => Some(RegistryError::Unauthorized(format!(
            "{what}: the API server did not accept the credentials: {}",
            s.message
        ))),
        Some(s) if s.code == 403 => {
            let role = match &what.namespace {
                Some(ns) => format!("a Role in namespace {ns}"),
                None => "a ClusterRole".to_string(),
            };
            Some(RegistryError::Unauthorized(format!(
                "{what}: forbidden; the adapter needs the verbs get, list and watch on {} through {role}: {}",
                what.resource, s.message
            )))
        }
        _ => Some(RegistryError::Unavailable(format!("{what}: {err}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16, message: &str) -> kube::runtime::watcher::Error {
        let mut s = Status::failure(message, "x");
        s.code = code;
        kube::runtime::watcher::Error::InitialListFailed(kube::Error::Api(Box::new(s)))
    }

    #[test]
    fn forbidden_names_verbs_resource_and_scope() {
        let what = Activity {
            resource: "endpointslices.discovery.k8s.io",
            namespace: Some("shop".into()),
        };
        let e = classify(&api(403, "User \"x\" cannot list"), &what).expect("an error");
        let msg = e.to_string();
        assert!(matches!(e, RegistryError::Unauthorized(_)));
        for part in [
            "list/watch endpointslices.discovery.k8s.io in namespace shop",
            "get, list and watch",
            "Role in namespace shop",
            "cannot list",
        ] {
            assert!(msg.contains(part), "{msg}");
        }
        assert!(classify(&api(410, "too old"), &what).is_none());
        assert!(matches!(
            classify(&api(500, "boom"), &what),
            Some(RegistryError::Unavailable(_))
        ));
    }
}
