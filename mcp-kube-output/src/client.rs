//! Connecting to an API server the way kubectl does (shared with adapter-kube's watch), and the
//! ServiceEntry resource the output writes.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::ApiResource;
use kube::{Client, Config};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig named on the command line could not be read.
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

/// A client for the cluster a kubeconfig file and context name; without either, kubectl's
/// order: `KUBECONFIG`, `~/.kube/config`, then the in-cluster service account.
pub async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<Client, ClientError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let config = if let Some(path) = kubeconfig {
        let bad = |source| ClientError::Kubeconfig {
            path: path.display().to_string(),
            source,
        };
        let file = Kubeconfig::read_from(path).map_err(bad)?;
        Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(bad)?
    } else if context.is_some() {
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

/// `networking.istio.io/v1` ServiceEntry (served by Istio 1.22+, the first release whose
/// ambient index reads ServiceEntries from Kubernetes only).
pub fn service_entries() -> ApiResource {
    ApiResource {
        group: "networking.istio.io".into(),
        version: "v1".into(),
        api_version: mcp_core::cache::json::API_VERSION.into(),
        kind: "ServiceEntry".into(),
        plural: "serviceentries".into(),
    }
}

/// The HTTP status of a failed request, when the API server answered.
pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// A failed request worth retrying later as a whole (the API server or the way to it is
/// unwell), as opposed to one object the API server refused.
pub fn transient(e: &kube::Error) -> bool {
    match status_code(e) {
        Some(code) => code == 429 || code >= 500,
        None => true,
    }
}

/// The request's outcome as the metric's `code` label.
pub fn code_label(r: &Result<(), &kube::Error>) -> String {
    match r {
        Ok(()) => "200".into(),
        Err(e) => status_code(e).map_or_else(|| "error".into(), |c| c.to_string()),
    }
}
