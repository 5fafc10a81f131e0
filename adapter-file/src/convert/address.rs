//! `host:port` splitting for the inventory's endpoint shorthand.

/// Splits `host:port`, `[v6]:port`, `[v6]`, a bare IPv6 address or a bare host.
pub(super) fn split_host_port(s: &str) -> Result<(String, Option<u32>), String> {
    let parse_port = |p: &str| match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(n),
        _ => Err(format!("`{p}` in `{s}` is not a port number (1-65535)")),
    };
    if let Some(rest) = s.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(format!("`{s}` has `[` without `]`"));
        };
        return match after {
            "" => Ok((host.to_owned(), None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((host.to_owned(), Some(parse_port(p)?))),
                None => Err(format!("unexpected `{after}` after `]` in `{s}`")),
            },
        };
    }
    match s.split_once(':') {
        // Two or more colons without brackets: a bare IPv6 address.
        Some((host, port)) if !port.contains(':') => Ok((host.to_owned(), Some(parse_port(port)?))),
        _ => Ok((s.to_owned(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_splitting() {
        assert_eq!(split_host_port("10.0.0.1"), Ok(("10.0.0.1".into(), None)));
        assert_eq!(
            split_host_port("host.example:80"),
            Ok(("host.example".into(), Some(80)))
        );
        assert_eq!(split_host_port("fd00::1"), Ok(("fd00::1".into(), None)));
        assert_eq!(split_host_port("[fd00::1]"), Ok(("fd00::1".into(), None)));
        assert!(split_host_port("10.0.0.1:0").is_err());
        assert!(split_host_port("[fd00::1]x").is_err());
    }
}
