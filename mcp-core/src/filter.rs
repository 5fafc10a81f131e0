//! Allow/deny filters on registry names, shared by every adapter so that `--allow`/`--deny`
//! style flags mean the same everywhere.

/// Shell-style glob: `*` any run of characters (also none), `?` exactly one; everything else
/// matches itself, case-sensitively. Runs in O(pattern × text) at worst, without allocating.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and the text position it currently stands for.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == t[ti] || (p[pi] == b'?' && char_start(t, ti))) {
            if p[pi] == b'?' {
                ti += char_len(t, ti);
            } else {
                ti += 1;
            }
            pi += 1;
        } else if let Some((sp, st)) = star {
            let next = st + char_len(t, st);
            star = Some((sp, next));
            pi = sp + 1;
            ti = next;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

fn char_start(t: &[u8], i: usize) -> bool {
    t[i] & 0xC0 != 0x80
}

/// Length in bytes of the UTF-8 character starting at `i` (1 for a continuation byte).
fn char_len(t: &[u8], i: usize) -> usize {
    match t[i] {
        b if b >= 0xF0 => 4,
        b if b >= 0xE0 => 3,
        b if b >= 0xC0 => 2,
        _ => 1,
    }
    .min(t.len() - i)
}

/// `allow` globs (empty = everything) minus `deny` globs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NameFilter {
    /// A name must match one of these (when any are given).
    pub allow: Vec<String>,
    /// A name matching one of these is left out, even if allowed.
    pub deny: Vec<String>,
}

impl NameFilter {
    /// A filter from flag values.
    pub fn new(allow: Vec<String>, deny: Vec<String>) -> Self {
        Self { allow, deny }
    }

    /// Whether `name` passes.
    pub fn allows(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|g| glob_match(g, name)))
            && !self.deny.iter().any(|g| glob_match(g, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("web*", "web"));
        assert!(glob_match("web*", "web-api"));
        assert!(glob_match("*-api", "web-api"));
        assert!(glob_match("w?b", "wéb"));
        assert!(glob_match("com.example.*", "com.example.OrderService"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(!glob_match("web", "web2"));
        assert!(!glob_match("?", ""));
        assert!(!glob_match("Web*", "web"));
        assert!(glob_match("1.?.0", "1.2.0"));
        assert!(!glob_match("1.?.0", "1.22.0"));
        assert!(glob_match("**a", "ba"));
        assert!(glob_match("a*b*c", "abcbc"));
        assert!(!glob_match("", "x"));
        assert!(glob_match("", ""));
    }

    #[test]
    fn allow_then_deny() {
        let f = NameFilter::new(vec!["web*".into(), "db".into()], vec!["*-canary".into()]);
        assert!(f.allows("web"));
        assert!(f.allows("db"));
        assert!(!f.allows("web-canary"));
        assert!(!f.allows("cache"));
        assert!(NameFilter::default().allows("anything"));
    }
}
