//! `--tls-client-san`: which client certificates may use the gRPC port beyond chaining to
//! `--tls-client-ca`.
//!
//! A CA such as a mesh's signs every workload, so "signed by the CA" admits any pod in the
//! mesh; the allow-list narrows that to the sinks meant to read the registry (by SPIFFE ID,
//! `spiffe://cluster.local/ns/<ns>/sa/<account>`, or DNS name). Names are matched against the
//! certificate's subject alternative names only (the subject CN is not an identity since
//! RFC 6125).

use std::fmt;

/// One allowed name, as written on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SanPattern {
    /// A DNS SAN, compared without regard to ASCII case (DNS names are case-insensitive).
    Dns(String),
    /// A URI SAN (a SPIFFE ID), compared exactly.
    Uri(String),
    /// `spiffe://trust-domain/*` or `spiffe://td/ns/istio-system/*`: any URI SAN that starts with
    /// the part before `*` (which ends in `/`, so `ns/a/*` does not admit `ns/ab/...`).
    UriPrefix(String),
}

impl SanPattern {
    /// Reads one `--tls-client-san` entry; the error says what is wrong with it.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let s = entry.trim();
        if s.is_empty() {
            return Err("an empty name (a stray comma?)".into());
        }
        if s.chars().any(char::is_whitespace) {
            return Err(format!("{s:?} contains whitespace"));
        }
        let Some((scheme, rest)) = s.split_once("://") else {
            if s.contains('*') {
                return Err(format!(
                    "{s:?}: DNS names are matched exactly; only a URI may end in /* (spiffe://trust-domain/*)"
                ));
            }
            return Ok(Self::Dns(s.to_ascii_lowercase()));
        };
        if scheme.is_empty() || rest.is_empty() {
            return Err(format!("{s:?} is not a URI (scheme://rest)"));
        }
        match s.find('*') {
            None => Ok(Self::Uri(s.to_string())),
            Some(i) if i == s.len() - 1 && s.ends_with("/*") && i > scheme.len() + 3 => {
                Ok(Self::UriPrefix(s[..i].to_string()))
            }
            Some(_) => Err(format!(
                "{s:?}: a URI may hold `*` only as its last path segment (spiffe://trust-domain/*)"
            )),
        }
    }

    fn matches(&self, name: &PresentedSan) -> bool {
        match (self, name) {
            (Self::Dns(want), PresentedSan::Dns(got)) => want.eq_ignore_ascii_case(got),
            (Self::Uri(want), PresentedSan::Uri(got)) => want == got,
            (Self::UriPrefix(prefix), PresentedSan::Uri(got)) => got.starts_with(prefix.as_str()),
            _ => false,
        }
    }
}

impl fmt::Display for SanPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(s) | Self::Uri(s) => f.write_str(s),
            Self::UriPrefix(p) => write!(f, "{p}*"),
        }
    }
}

/// A name a client certificate carries, as read by [`super::cert::presented_sans`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PresentedSan {
    /// `DNS:`
    Dns(String),
    /// `URI:`
    Uri(String),
}

impl fmt::Display for PresentedSan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(s) => write!(f, "DNS:{s}"),
            Self::Uri(s) => write!(f, "URI:{s}"),
        }
    }
}

/// Every `--tls-client-san`; empty admits any certificate the CA signed (the behaviour before
/// the flag existed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SanAllowList(Vec<SanPattern>);

impl SanAllowList {
    /// The list of `patterns`.
    pub fn new(patterns: Vec<SanPattern>) -> Self {
        Self(patterns)
    }

    /// True when no name was given (every certificate the CA signed is admitted).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True if one of `presented` is allowed, or the list is empty.
    pub fn admits(&self, presented: &[PresentedSan]) -> bool {
        self.is_empty()
            || presented
                .iter()
                .any(|n| self.0.iter().any(|p| p.matches(n)))
    }
}

impl fmt::Display for SanAllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> SanAllowList {
        SanAllowList::new(
            entries
                .iter()
                .map(|e| SanPattern::parse(e).expect("valid"))
                .collect(),
        )
    }
    fn uri(s: &str) -> PresentedSan {
        PresentedSan::Uri(s.into())
    }
    fn dns(s: &str) -> PresentedSan {
        PresentedSan::Dns(s.into())
    }

    const ISTIOD: &str = "spiffe://cluster.local/ns/istio-system/sa/istiod";

    #[test]
    fn an_empty_list_admits_every_certificate() {
        assert!(SanAllowList::default().admits(&[]));
        assert!(SanAllowList::default().admits(&[dns("anything")]));
    }

    #[test]
    fn exact_spiffe_ids_and_dns_names() {
        let l = list(&[ISTIOD, "Istiod.Istio-System.svc"]);
        assert!(l.admits(&[uri(ISTIOD)]));
        assert!(l.admits(&[dns("x"), dns("istiod.istio-system.svc")]));
        assert!(!l.admits(&[uri("spiffe://cluster.local/ns/default/sa/istiod")]));
        assert!(!l.admits(&[uri(&format!("{ISTIOD}-canary"))]));
        // A DNS SAN that spells the SPIFFE ID is not the URI SAN, nor the other way round.
        assert!(!l.admits(&[dns(ISTIOD)]));
        assert!(!l.admits(&[uri("istiod.istio-system.svc")]));
        assert!(!l.admits(&[]), "a certificate with no SAN");
    }

    #[test]
    fn a_trailing_star_admits_one_trust_domain_or_namespace() {
        let l = list(&["spiffe://cluster.local/ns/istio-system/*"]);
        assert!(l.admits(&[uri(ISTIOD)]));
        assert!(!l.admits(&[uri("spiffe://cluster.local/ns/istio-system-2/sa/x")]));
        assert!(!l.admits(&[uri("spiffe://cluster.local/ns/default/sa/istiod")]));
        let td = list(&["spiffe://cluster.local/*"]);
        assert!(td.admits(&[uri(ISTIOD)]));
        assert!(!td.admits(&[uri("spiffe://cluster.local.evil/ns/a/sa/b")]));
        assert_eq!(td.to_string(), "spiffe://cluster.local/*");
    }

    #[test]
    fn bad_entries_are_refused_saying_why() {
        for (entry, why) in [
            ("", "empty"),
            ("*.example.com", "DNS names are matched exactly"),
            ("spiffe://cluster.local/ns/*/sa/istiod", "last path segment"),
            ("spiffe://*", "last path segment"),
            ("spiffe://td*", "last path segment"),
            ("://x", "not a URI"),
            ("a b", "whitespace"),
        ] {
            let err = SanPattern::parse(entry).expect_err(entry);
            assert!(err.contains(why), "{entry:?}: {err}");
        }
    }
}
