//! Istio protocols from port names, for inventories (which give ports only a name).

/// Istio protocol for a port name, the way Istio reads Kubernetes port names: the prefix before
/// the first `-` (case-insensitive), with `grpc-web` checked first because it contains a `-`.
pub fn protocol_from_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if lower == "grpc-web" || lower.starts_with("grpc-web-") {
        return Some("GRPC-Web");
    }
    let prefix = lower.split('-').next().unwrap_or_default();
    Some(match prefix {
        "http" => "HTTP",
        "http2" => "HTTP2",
        "https" => "HTTPS",
        "grpc" => "GRPC",
        "tcp" => "TCP",
        "tls" => "TLS",
        "udp" => "UDP",
        "mongo" => "Mongo",
        "mysql" => "MySQL",
        "redis" => "Redis",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names() {
        assert_eq!(protocol_from_name("HTTPS-admin"), Some("HTTPS"));
        assert_eq!(protocol_from_name("grpc-web-ui"), Some("GRPC-Web"));
        assert_eq!(protocol_from_name("grpc-webx"), Some("GRPC"));
        assert_eq!(protocol_from_name("tls"), Some("TLS"));
        assert_eq!(protocol_from_name("udp-dns"), Some("UDP"));
        assert_eq!(protocol_from_name("mysql"), Some("MySQL"));
        assert_eq!(protocol_from_name("redis-cache"), Some("Redis"));
        assert_eq!(protocol_from_name("web"), None);
    }
}
