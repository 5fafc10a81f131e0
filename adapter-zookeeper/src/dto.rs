//! What ZooKeeper registries write, as written: Dubbo provider URLs (the znode names under a
//! `providers` directory, URL-encoded) and Curator ServiceInstance JSON (the data of an instance
//! znode, with Dubbo 3's `dubbo.endpoints` inside).
//!
//! Parsing only, kept apart from [`crate::convert`] (which decides what the parsed values mean
//! for the model): nothing here knows of services, filters or problems.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Decodes `application/x-www-form-urlencoded` text once (`+` = space, `%XX` = byte).
pub fn form_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent escape at byte {i}"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "decoded text is not UTF-8".to_string())
}

/// Encodes text the way Dubbo names a provider znode (`java.net.URLEncoder`, UTF-8): letters,
/// digits and `.-_*` stay, a space is `+`, every other byte `%XX`. The inverse of
/// [`form_decode`]; what tests and tools that write providers use.
pub fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A parsed provider URL `scheme://host:port/path?k=v&...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderUrl {
    /// RPC protocol (`dubbo`, `tri`, `rest`, ...), lower-cased.
    pub scheme: String,
    /// Host as written (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u32,
    /// Path (usually the interface), without the leading `/`.
    pub path: String,
    /// Query parameters (values percent-decoded once more when they still carry escapes).
    pub params: BTreeMap<String, String>,
}

/// Parses a decoded provider URL.
pub fn parse_url(url: &str) -> Result<ProviderUrl, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "no scheme (expected protocol://host:port/path?query)".to_string())?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return Err(format!("bad scheme {scheme:?}"));
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, q),
        None => (rest, ""),
    };
    let (authority, path) = match before_query.split_once('/') {
        Some((a, p)) => (a, p),
        None => (before_query, ""),
    };
    // user:password@ is legal in Dubbo URLs; never keep it.
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, p) = v6
            .split_once("]:")
            .ok_or_else(|| format!("bad address {authority:?}"))?;
        (h, p)
    } else {
        authority
            .rsplit_once(':')
            .ok_or_else(|| format!("no port in {authority:?}"))?
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port: u32 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
    let mut params = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        // Dubbo encodes the whole URL once; values like `ipv6` or `methods` need no second pass,
        // but a value that still holds escapes (double-encoded by some clients) is decoded again.
        let v = if v.contains('%') {
            form_decode(v).unwrap_or_else(|_| v.to_string())
        } else {
            v.to_string()
        };
        params.insert(k.to_string(), v);
    }
    Ok(ProviderUrl {
        scheme: scheme.to_ascii_lowercase(),
        host: host.to_string(),
        port,
        path: path.to_string(),
        params,
    })
}

/// Curator ServiceInstance JSON (curator-x-discovery `ServiceInstance`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CuratorInstance {
    /// Service name.
    #[serde(default)]
    pub name: Option<String>,
    /// Instance id.
    #[serde(default)]
    pub id: Option<String>,
    /// Address (IP expected).
    #[serde(default)]
    pub address: Option<String>,
    /// Port.
    #[serde(default)]
    pub port: Option<i64>,
    /// TLS port.
    #[serde(default)]
    pub ssl_port: Option<i64>,
    /// Payload: Spring/Dubbo put `metadata` here.
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    /// Registration time, ms since the epoch.
    #[serde(default, rename = "registrationTimeUTC")]
    pub registration_time_utc: Option<i64>,
    /// `DYNAMIC`, `STATIC`, ...
    #[serde(default)]
    pub service_type: Option<String>,
    /// Curator 4+: false = disabled.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// `dubbo.endpoints` element.
#[derive(Clone, Debug, Deserialize)]
pub struct DubboEndpoint {
    /// Port.
    pub port: i64,
    /// Protocol, if given.
    #[serde(default)]
    pub protocol: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encode_is_what_dubbo_writes_and_decodes_back() {
        let url = form_decode(REAL).expect("decodes");
        assert_eq!(form_encode(&url), REAL);
        assert_eq!(form_encode("a b*c"), "a+b*c");
        assert_eq!(
            form_decode(&form_encode("x=1&y=ü")).as_deref(),
            Ok("x=1&y=ü")
        );
    }

    const REAL: &str = "dubbo%3A%2F%2F30.221.146.35%3A20880%2Forg.apache.dubbo.samples.api.GreetingsService%3Fanyhost%3Dtrue%26application%3Dfirst-dubbo-provider%26background%3Dfalse%26deprecated%3Dfalse%26dubbo%3D2.0.2%26dynamic%3Dtrue%26environment%3Dproduct%26generic%3Dfalse%26interface%3Dorg.apache.dubbo.samples.api.GreetingsService%26ipv6%3Dfd00%3A1%3A5%3A5200%3A3218%3A774a%3A4f67%3A2341%26methods%3DsayHi%26pid%3D85639%26release%3D3.1.4%26service-name-mapping%3Dtrue%26side%3Dprovider%26timestamp%3D1674960780647";

    #[test]
    fn decodes_and_parses_a_real_provider_url() {
        let url = parse_url(&form_decode(REAL).expect("decodes")).expect("parses");
        assert_eq!(url.scheme, "dubbo");
        assert_eq!(url.host, "30.221.146.35");
        assert_eq!(url.port, 20880);
        assert_eq!(url.path, "org.apache.dubbo.samples.api.GreetingsService");
        assert_eq!(url.params["ipv6"], "fd00:1:5:5200:3218:774a:4f67:2341");
        assert_eq!(url.params["methods"], "sayHi");
        assert_eq!(url.params.len(), 16);
        assert_eq!(form_decode("a+b%2Bc").as_deref(), Ok("a b+c"));
        assert!(form_decode("%zz").is_err());
        assert!(form_decode("%4").is_err());
        let v6 = parse_url("tri://[fd00::1]:50051/x?a=1").expect("v6");
        assert_eq!((v6.host.as_str(), v6.port), ("fd00::1", 50051));
        assert!(parse_url("no-scheme").is_err());
        assert!(parse_url("dubbo://10.0.0.1/x").is_err(), "no port");
        assert!(parse_url("dubbo://10.0.0.1:x/x").is_err());
    }
}
