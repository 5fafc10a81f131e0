//! Connecting to the API server the way kubectl does, and saying what a failed request means.

use kube::Client;
use mcp_core::RegistryError;

use crate::config::KubeConfig;

pub use mcp_kube_output::ClientError;

/// A client for the cluster the flags name (kubectl's order; the same code as the Kubernetes
/// output's).
pub async fn connect(cfg: &KubeConfig) -> Result<Client, ClientError> {
    mcp_kube_output::connect(cfg.kubeconfig.as_deref(), cfg.context.as_deref()).await
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

/// What a watcher's error means for the watch.
#[derive(Debug)]
pub enum Failure {
    /// The resource version expired (410 Gone): the watcher lists again by itself.
    Expired,
    /// A dropped connection, a timeout, a 429 or a 5xx: the watcher retries after its backoff
    /// from its last resource version; what was sent stays valid and the watch goes on.
    Transient(RegistryError),
    /// Retrying the same request cannot help (401, 403, another 4xx, or a watch start refused
    /// with 410, which the watcher would retry from the same version): the watch ends, and the
    /// core starts a new one, which lists everything again.
    Fatal(RegistryError),
}

/// What `err` means for the watch of `what`.
pub fn classify(err: &kube::runtime::watcher::Error, what: &Activity) -> Failure {
    use kube::runtime::watcher::Error as W;
    let status = match err {
        W::InitialListFailed(kube::Error::Api(s))
        | W::WatchStartFailed(kube::Error::Api(s))
        | W::WatchFailed(kube::Error::Api(s)) => Some(s.as_ref()),
        W::WatchError(s) => Some(s.as_ref()),
        _ => None,
    };
    let Some(s) = status else {
        // Connection refused or reset, TLS, a timeout, a body that did not decode, an object
        // without a resource version (the watcher lists again): all retried where they were.
        return Failure::Transient(RegistryError::Unavailable(format!("{what}: {err}")));
    };
    match s.code {
        // After these the watcher lists again by itself.
        410 if matches!(err, W::WatchError(_) | W::InitialListFailed(_)) => Failure::Expired,
        401 => Failure::Fatal(RegistryError::Unauthorized(format!(
            "{what}: the API server did not accept the credentials: {}",
            s.message
        ))),
        403 => {
            let role = match &what.namespace {
                Some(ns) => format!("a Role in namespace {ns}"),
                None => "a ClusterRole".to_string(),
            };
            Failure::Fatal(RegistryError::Unauthorized(format!(
                "{what}: forbidden; the adapter needs the verbs get, list and watch on {} through {role}: {}",
                what.resource, s.message
            )))
        }
        429 | 500..=599 => Failure::Transient(RegistryError::Unavailable(format!("{what}: {err}"))),
        _ => Failure::Fatal(RegistryError::Unavailable(format!("{what}: {err}"))),
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
        let Failure::Fatal(e) = classify(&api(403, "User \"x\" cannot list"), &what) else {
            panic!("a 403 ends the watch");
        };
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
        assert!(matches!(
            classify(&api(410, "too old"), &what),
            Failure::Expired
        ));
        for code in [500, 503, 429] {
            assert!(matches!(
                classify(&api(code, "busy"), &what),
                Failure::Transient(RegistryError::Unavailable(_))
            ));
        }
        assert!(matches!(
            classify(&api(404, "no such resource"), &what),
            Failure::Fatal(RegistryError::Unavailable(_))
        ));
        // A refused watch start is retried by the watcher from the same version: a 410 there
        // needs a new list, which only a new watch makes.
        let mut gone = Status::failure("too old", "Expired");
        gone.code = 410;
        let start =
            kube::runtime::watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(gone)));
        assert!(matches!(classify(&start, &what), Failure::Fatal(_)));
        // Not an answer at all: retried.
        assert!(matches!(
            classify(&kube::runtime::watcher::Error::NoResourceVersion, &what),
            Failure::Transient(_)
        ));
    }
}
