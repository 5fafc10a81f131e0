//! Names Istio and Kubernetes accept: DNS hosts, resource names, labels, port names.
//!
//! Registry names are *mapped* (lower-cased, invalid characters replaced) because registries allow
//! characters Istio rejects (`providers:com.foo.Api`, `My_Service`); names a person wrote as a
//! complete host are *validated* instead, so a typo is reported rather than silently rewritten.

/// Longest DNS label / label name / label value.
pub const MAX_LABEL: usize = 63;
/// Longest DNS name / label prefix.
pub const MAX_SUBDOMAIN: usize = 253;
/// Istio's prefix of a Unix domain socket endpoint address (`UnixAddressPrefix`).
pub const UNIX_PREFIX: &str = "unix://";

/// Maps one DNS label: lower-case, `[^a-z0-9-]` -> `-`, no leading/trailing `-`, at most 63 bytes.
pub fn map_dns_label(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    collapse_dashes(&mut out);
    out.truncate(MAX_LABEL);
    out.trim_matches('-').to_string()
}

fn collapse_dashes(s: &mut String) {
    let mut prev = false;
    s.retain(|c| {
        let dash = c == '-';
        let keep = !(dash && prev);
        prev = dash;
        keep
    });
}

/// FNV-1a, 32 bits, over `parts` with a separator between them: a short stable hash for names
/// (not security relevant).
pub fn fnv1a32(parts: &[&str]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // A separator byte that cannot occur in UTF-8 text keeps ("a","bc") != ("ab","c").
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0193);
        }
        for b in p.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// `label` (already mapped) with `-{8 hex digits of hash}` appended, cut so the result is a DNS
/// label of at most 63 bytes: the name a registry object gets when its readable name is taken.
pub fn label_with_hash(label: &str, hash: u32) -> String {
    let suffix = format!("{hash:08x}");
    let mut head = label.to_string();
    head.truncate(MAX_LABEL - suffix.len() - 1);
    let head = head.trim_end_matches('-');
    if head.is_empty() {
        suffix
    } else {
        format!("{head}-{suffix}")
    }
}

/// Maps a registry name to a dotted DNS name: each `.`-separated part via [`map_dns_label`],
/// empty parts dropped.
pub fn map_dns_name(s: &str) -> String {
    s.split('.')
        .map(map_dns_label)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(".")
}

/// Is `s` a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, <= 63)?
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Is `s` a DNS-1123 subdomain (dot-separated labels, <= 253)?
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN && s.split('.').all(is_dns_label)
}

/// Validates a host a person wrote: a DNS subdomain, optionally starting with `*.`, whose last
/// label is not a number; lower-cased.
///
/// Istio refuses an all-digit top-level label (`ValidateDNS1123Labels`: `svc-1.2`, or an IP
/// address `1.2.3.4` taken for a name), and a host of one numeric label where it must be an FQDN
/// (DNS resolution without endpoints), so neither is a host here.
pub fn check_host(host: &str) -> Result<String, String> {
    let lower = host.trim().to_ascii_lowercase();
    let rest = lower.strip_prefix("*.").unwrap_or(&lower);
    if lower == "*" {
        return Err("\"*\" is not allowed; name the hosts".into());
    }
    let numeric_tld = rest
        .rsplit('.')
        .next()
        .is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()));
    if numeric_tld {
        Err(format!(
            "{host:?} ends in a number, which Istio refuses as a top-level domain"
        ))
    } else if is_dns_subdomain(rest) {
        Ok(lower)
    } else {
        Err(format!("{host:?} is not a valid DNS name"))
    }
}

/// Maps a resource name to a DNS-1123 subdomain (what Kubernetes accepts as a ServiceEntry name).
pub fn map_resource_name(s: &str) -> String {
    let mut name = map_dns_name(s);
    name.truncate(MAX_SUBDOMAIN);
    name.trim_end_matches(['-', '.']).to_string()
}

fn is_label_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// Checks a Kubernetes label key (`[prefix/]name`).
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if !is_dns_subdomain(p) {
            return Err(format!("label key {key:?}: prefix is not a DNS subdomain"));
        }
    }
    if !is_label_part(name) {
        return Err(format!(
            "label key {key:?}: name must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ));
    }
    Ok(())
}

/// Checks a Kubernetes label value (empty, or like a label name).
pub fn check_label_value(key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_part(value) {
        Ok(())
    } else {
        Err(format!(
            "label {key:?}: value {value:?} must be at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ))
    }
}

/// Istio's protocol names (`pkg/config/protocol`), matched case-insensitively, in Istio's casing.
pub const PROTOCOLS: [&str; 12] = [
    "GRPC",
    "GRPC-Web",
    "HTTP",
    "HTTP_PROXY",
    "HTTP2",
    "HTTPS",
    "TCP",
    "TLS",
    "UDP",
    "Mongo",
    "Redis",
    "MySQL",
];

/// Istio's spelling of a protocol name, or `None` if Istio does not know it.
pub fn canonical_protocol(p: &str) -> Option<&'static str> {
    PROTOCOLS
        .iter()
        .copied()
        .find(|c| c.eq_ignore_ascii_case(p))
}

/// Can Istio tell hosts apart on this protocol (HTTP Host header or TLS SNI)?
pub fn distinguishes_hosts(p: Option<&str>) -> bool {
    matches!(
        p,
        Some("HTTP" | "HTTP2" | "HTTPS" | "GRPC" | "GRPC-Web" | "HTTP_PROXY" | "TLS")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_registry_names_to_dns() {
        assert_eq!(map_dns_name("My_Service"), "my-service");
        assert_eq!(
            map_dns_name("providers:com.foo.Api:1.0:grp"),
            "providers-com.foo.api-1.0-grp"
        );
        assert_eq!(map_dns_name("..a..b."), "a.b");
        assert_eq!(map_dns_label("--x__y--"), "x-y");
        assert_eq!(map_dns_label(&"a".repeat(80)).len(), 63);
        assert_eq!(map_dns_label("ÄÖ"), "");
    }

    #[test]
    fn validates_hosts() {
        assert_eq!(
            check_host("Foo.Example.com").as_deref(),
            Ok("foo.example.com")
        );
        assert_eq!(check_host("*.example.com").as_deref(), Ok("*.example.com"));
        assert!(check_host("*").is_err());
        assert!(check_host("a_b.example").is_err());
        assert!(check_host("-a.example").is_err());
        assert!(check_host("").is_err());
        // Istio refuses a numeric top-level label.
        assert!(check_host("svc-1.2").is_err());
        assert!(check_host("1.2.3.4").is_err());
        assert!(check_host("123").is_err());
        assert!(check_host("*.123").is_err());
        assert!(check_host("svc.v2").is_ok());
        assert!(check_host("123.example").is_ok());
    }

    #[test]
    fn validates_labels() {
        assert!(check_label_key("app").is_ok());
        assert!(check_label_key("example.com/app_v1.2").is_ok());
        assert!(check_label_key("Ex_ample/app").is_err());
        assert!(check_label_key("a/b/c").is_err());
        assert!(check_label_key("-app").is_err());
        assert!(check_label_key(&"k".repeat(64)).is_err());
        assert!(check_label_value("k", "").is_ok());
        assert!(check_label_value("k", "v1.0_a-b").is_ok());
        assert!(check_label_value("k", "a,b").is_err());
        assert!(check_label_value("k", "x|").is_err());
    }

    #[test]
    fn protocols_follow_istio() {
        assert_eq!(canonical_protocol("grpc-web"), Some("GRPC-Web"));
        assert_eq!(canonical_protocol("mysql"), Some("MySQL"));
        assert_eq!(canonical_protocol("http"), Some("HTTP"));
        assert_eq!(canonical_protocol("dubbo"), None);
        assert!(distinguishes_hosts(Some("TLS")));
        assert!(!distinguishes_hosts(Some("TCP")));
        assert!(!distinguishes_hosts(None));
    }
}
