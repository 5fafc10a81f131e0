//! Reading PEM files into what the TLS acceptor serves and verifies with, checked before use:
//! a reload must never swap in a pair the handshake would fail with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::RootCertStore;
use x509_parser::extensions::GeneralName;

use super::san::PresentedSan;

/// A file that cannot be used; `path` names it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct CertError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

impl CertError {
    fn new(path: &Path, problem: impl Into<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// The served certificate chain and key, with the leaf's facts for logs and metrics.
#[derive(Debug)]
pub struct ServedPair {
    /// What the handshake sends and signs with.
    pub key: Arc<CertifiedKey>,
    /// The leaf's serial number, hex.
    pub serial: String,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
}

/// Reads `cert` (PEM chain, leaf first) and `key` (PEM private key) from their bytes and checks
/// that the key is the leaf's.
pub fn served_pair(
    cert: (&Path, &[u8]),
    key: (&Path, &[u8]),
    provider: &CryptoProvider,
) -> Result<ServedPair, CertError> {
    let chain = CertificateDer::pem_slice_iter(cert.1)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::new(cert.0, format!("not a PEM certificate chain: {e}")))?;
    let leaf = chain
        .first()
        .ok_or_else(|| CertError::new(cert.0, "holds no certificate"))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf).map_err(|e| {
        CertError::new(cert.0, format!("the first certificate does not parse: {e}"))
    })?;
    let serial = parsed.raw_serial_as_string();
    let not_after = parsed.validity().not_after.timestamp();
    let private = PrivateKeyDer::from_pem_slice(key.1)
        .map_err(|e| CertError::new(key.0, format!("not a PEM private key: {e}")))?;
    let certified = CertifiedKey::from_der(chain, private, provider)
        .map_err(|e| CertError::new(key.0, format!("not usable with {}: {e}", cert.0.display())))?;
    Ok(ServedPair {
        key: Arc::new(certified),
        serial,
        not_after,
    })
}

/// A verifier demanding a client certificate that chains to one of the CAs in `pem`.
pub fn client_verifier(
    path: &Path,
    pem: &[u8],
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, CertError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| CertError::new(path, format!("not a PEM CA bundle: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| CertError::new(path, format!("a CA certificate is not usable: {e}")))?;
    }
    if roots.is_empty() {
        return Err(CertError::new(path, "holds no CA certificate"));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| CertError::new(path, format!("not usable as client CAs: {e}")))
}

/// The DNS and URI subject alternative names of `cert` (a verified client leaf); a
/// certificate that does not parse presents none.
pub fn presented_sans(cert: &CertificateDer<'_>) -> Vec<PresentedSan> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return Vec::new();
    };
    let Ok(Some(ext)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(s) => Some(PresentedSan::Dns((*s).to_string())),
            GeneralName::URI(s) => Some(PresentedSan::Uri((*s).to_string())),
            _ => None,
        })
        .collect()
}
