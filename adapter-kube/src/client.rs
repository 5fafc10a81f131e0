//! Connecting to the API server the way kubectl does, and saying what a failed request means.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use mcp_core::RegistryError;

use crate::config::KubeConfig;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig named by `--kubeconfig` could not be read.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What went wrong.
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor the in-cluster environment gave a configuration.
    #[error("no Kubernetes configuration: {0}")]
    Infer(String),
    /// The configuration could not be turned into a client (bad certificate, bad URL).
    #[error("Kubernetes client: {0}")]
    Build(#[from] kube::Error),
}

/// A client for the cluster the flags name.
pub async fn connect(cfg: &KubeConfig) -> Result<Client, ClientError> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = if let Some(path) = &cfg.kubeconfig {
        let file = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?
    } else if cfg.context.is_some() {
        Config::from_kubeconfig(&options)
            .await
            .map_err(|e| ClientError::Infer(e.to_string()))?
    } else {
        Config::infer()
            .await
            .map_err(|e| ClientError::Infer(e.to_string()))?
    };
    Ok(Client::try_from(config)?)
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
