//! Refuses every request (MCP, xDS, health, reflection) of a client whose certificate carries
//! no `--tls-client-san` name, with PERMISSION_DENIED naming the names it presented.
//!
//! Refusing here rather than failing the handshake gives the client a reason it can show: a
//! handshake failure reaches it as a bare TLS alert.

use tonic::transport::server::TlsConnectInfo;
use tonic::{Request, Status};

use crate::conn::ConnInfo;

use super::cert;
use super::san::SanAllowList;

/// The check for tonic's `InterceptorLayer`: with an empty list every request passes; with
/// names, only requests whose connection presented a certificate carrying one of them. A request
/// where no certificate can be found is refused too (with names, `--tls-client-ca` makes one
/// mandatory, so that would mean the connection info moved; failing closed keeps it visible).
pub fn authorize(
    allow: SanAllowList,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        if allow.is_empty() {
            return Ok(req);
        }
        let certs = req
            .extensions()
            .get::<TlsConnectInfo<ConnInfo>>()
            .and_then(TlsConnectInfo::peer_certs);
        let Some(certs) = certs else {
            return Err(Status::permission_denied(
                "no client certificate seen on this connection, and --tls-client-san is set",
            ));
        };
        let presented = certs.first().map(cert::presented_sans).unwrap_or_default();
        if allow.admits(&presented) {
            return Ok(req);
        }
        let names: Vec<String> = presented.iter().map(ToString::to_string).collect();
        Err(Status::permission_denied(format!(
            "the client certificate's subject alternative names [{}] are not allowed by this adapter's --tls-client-san",
            names.join(", ")
        )))
    }
}
