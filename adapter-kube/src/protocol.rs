//! The Istio protocol of a Kubernetes Service port, by Istio's own rules, so that a Service seen
//! through this adapter gets the protocol istiod would give it in its own cluster.
//!
//! Order: `protocol: UDP` wins; then `appProtocol`; then the port name's prefix before the first
//! `-` (`http-web`, `grpc`, `grpc-web-ui`); then well-known ports that are never HTTP. Anything
//! else is left to Istio's protocol sniffing (`None`).

use mcp_core::translate::naming::canonical_protocol;

/// Ports Istio treats as TCP when neither `appProtocol` nor the name says otherwise (SMTP, DNS,
/// MySQL, MongoDB: server-first protocols that sniffing would stall).
const WELL_KNOWN_TCP: [i32; 4] = [25, 53, 3306, 27017];

/// The protocol for a port with this transport (`TCP`, `UDP`, `SCTP`), `appProtocol` and name.
pub fn port_protocol(
    transport: Option<&str>,
    app_protocol: Option<&str>,
    name: &str,
    number: i32,
) -> Option<&'static str> {
    if transport == Some("UDP") {
        return Some("UDP");
    }
    if let Some(app) = app_protocol.filter(|a| !a.is_empty()) {
        match app {
            "kubernetes.io/h2c" => return Some("HTTP2"),
            "kubernetes.io/ws" => return Some("HTTP"),
            "kubernetes.io/wss" => return Some("HTTPS"),
            _ => {
                if let Some(p) = from_name(app) {
                    return Some(p);
                }
            }
        }
    } else if let Some(p) = from_name(name) {
        return Some(p);
    }
    WELL_KNOWN_TCP.contains(&number).then_some("TCP")
}

/// `grpc-web*` is gRPC-Web; otherwise the part before the first `-`, if Istio knows it. A UDP
/// spelled in a name is ignored: only the port's transport makes a port UDP.
fn from_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("grpc-web") {
        return Some("GRPC-Web");
    }
    let prefix = lower.split('-').next().unwrap_or_default();
    canonical_protocol(prefix).filter(|p| *p != "UDP")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_istios_order() {
        assert_eq!(
            port_protocol(Some("UDP"), Some("http"), "http", 80),
            Some("UDP")
        );
        assert_eq!(
            port_protocol(Some("TCP"), Some("grpc"), "http-x", 80),
            Some("GRPC")
        );
        assert_eq!(
            port_protocol(None, Some("kubernetes.io/h2c"), "", 80),
            Some("HTTP2")
        );
        assert_eq!(port_protocol(None, None, "http-web", 80), Some("HTTP"));
        assert_eq!(port_protocol(None, None, "HTTPS", 443), Some("HTTPS"));
        assert_eq!(
            port_protocol(None, None, "grpc-web-ui", 80),
            Some("GRPC-Web")
        );
        assert_eq!(port_protocol(None, None, "tcp-db", 5432), Some("TCP"));
        assert_eq!(port_protocol(None, None, "mysql", 1), Some("MySQL"));
        // A name Istio does not know: sniffed, unless the port is a well-known server-first one.
        assert_eq!(port_protocol(None, None, "web", 8080), None);
        assert_eq!(port_protocol(None, None, "", 3306), Some("TCP"));
        // UDP only from the transport.
        assert_eq!(port_protocol(Some("TCP"), None, "udp-dns", 5353), None);
        // An unknown appProtocol is not replaced by the name.
        assert_eq!(port_protocol(None, Some("custom.io/x"), "http", 8080), None);
    }
}
