//! Which services and Dubbo providers to serve (`--service`, `--exclude-service`,
//! `--dubbo-group`, `--dubbo-version` and their `--exclude-` forms).
//!
//! A name is allowed when the allow list is empty or one of its globs matches, and no deny
//! glob matches: deny always wins, so `--service 'com.example.*' --exclude-service
//! '*Internal*'` reads naturally. Globs are case-sensitive like the registry's names.

use mcp_core::filter::NameFilter;

use crate::config::ZookeeperConfig;

/// One allow/deny pair of glob lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Patterns(NameFilter);

impl Patterns {
    /// From the two flag lists (empty entries are dropped: `--service ''` means no filter).
    pub fn new(allow: &[String], deny: &[String]) -> Self {
        let clean = |v: &[String]| {
            v.iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        Self(NameFilter::new(clean(allow), clean(deny)))
    }

    /// Is `name` allowed?
    pub fn allows(&self, name: &str) -> bool {
        self.0.allows(name)
    }

    /// No pattern at all (everything allowed).
    pub fn is_empty(&self) -> bool {
        self.0.allow.is_empty() && self.0.deny.is_empty()
    }
}

/// Every filter of the adapter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filters {
    /// Service directory names: Dubbo interfaces, Curator/Spring services, Dubbo 3 applications.
    pub services: Patterns,
    /// Dubbo provider `group` parameter (missing = empty).
    pub groups: Patterns,
    /// Dubbo provider `version` parameter (missing = empty).
    pub versions: Patterns,
}

impl Filters {
    /// From the command line.
    pub fn new(cfg: &ZookeeperConfig) -> Self {
        Self {
            services: Patterns::new(&cfg.services.allow, &cfg.services.deny),
            groups: Patterns::new(&cfg.dubbo_groups.allow, &cfg.dubbo_groups.deny),
            versions: Patterns::new(&cfg.dubbo_versions.allow, &cfg.dubbo_versions.deny),
        }
    }

    /// Is a Dubbo provider of this group and version served?
    pub fn allows_provider(&self, group: &str, version: &str) -> bool {
        self.groups.allows(group) && self.versions.allows(version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_wins_and_empty_allows_everything() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_string()).collect::<Vec<_>>();
        let p = Patterns::new(&s(&["com.example.*"]), &s(&["*Internal*"]));
        assert!(p.allows("com.example.OrderService"));
        assert!(!p.allows("com.example.InternalApi"));
        assert!(!p.allows("org.other.Api"));
        let all = Patterns::new(&s(&[""]), &[]);
        assert!(all.is_empty() && all.allows("anything"));
        let f = Filters {
            groups: Patterns::new(&s(&["blue", ""]), &[]),
            versions: Patterns::new(&[], &s(&["0.*"])),
            ..Filters::default()
        };
        assert!(f.allows_provider("blue", "1.0.0"));
        assert!(!f.allows_provider("", "1.0.0"), "empty entries are dropped");
        assert!(!f.allows_provider("blue", "0.9"));
        assert!(!f.allows_provider("green", "1.0.0"));
    }
}
