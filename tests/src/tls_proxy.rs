//! A TLS-terminating TCP proxy: what stands in front of a server that speaks only plaintext
//! when a test needs the TLS a real deployment has there (Nacos' own TLS on its HTTP and gRPC
//! ports wants a keystore per server; a terminating load balancer is what many run). It presents `server.crt` of a
//! [`crate::pki::make_pki`] directory, optionally demands a client certificate signed by its
//! `ca.crt`, offers the given ALPN protocols, and copies bytes to and from `upstream`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A running proxy; stopped on drop.
pub struct TlsProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    _rt: tokio::runtime::Runtime,
}

impl TlsProxy {
    /// Listens on `listen` (port 0: any) and forwards each TLS connection, once its handshake
    /// is done, to `upstream` in plaintext. `alpn`: the protocols offered (`h2` for a gRPC
    /// port, `http/1.1` for an HTTP/1 one).
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        pki: &Path,
        client_cert: bool,
        alpn: &[&str],
    ) -> TlsProxy {
        let provider = Arc::new(ring::default_provider());
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(pki.join("server.crt"))
                .expect("server.crt")
                .collect::<Result<_, _>>()
                .expect("server.crt PEM");
        let key = PrivateKeyDer::from_pem_file(pki.join("server.key")).expect("server.key");
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(tokio_rustls::rustls::DEFAULT_VERSIONS)
            .expect("TLS versions");
        let mut config = if client_cert {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(pki.join("ca.crt")).expect("ca.crt") {
                roots.add(c.expect("ca.crt PEM")).expect("CA");
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
        } else {
            builder.with_no_client_auth().with_single_cert(chain, key)
        }
        .expect("server certificate");
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(listen))
            .expect("bind the TLS proxy");
        let addr = listener.local_addr().expect("local addr");
        let handshakes = Arc::new(AtomicUsize::new(0));
        let done = handshakes.clone();
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    done.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
        TlsProxy {
            addr,
            handshakes,
            _rt: rt,
        }
    }

    /// TLS handshakes completed so far (a client that failed its handshake is not counted).
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}
