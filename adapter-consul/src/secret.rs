//! The ACL token: a [`Secret`] that never prints, and where it comes from. A token file is
//! re-read when it changes, so a rotated token is picked up without a restart.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// A value that must not reach logs: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// What identifies one version of a file without reading it: a rewrite changes the
/// modification time or the length (or both), a replace-by-rename (Kubernetes secret volumes)
/// changes the modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

impl FileStamp {
    /// The stamp of `path` now; `None` when it cannot be read.
    pub fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            modified: m.modified().ok(),
            len: m.len(),
        })
    }
}

/// Why the token cannot be had.
#[derive(Debug, thiserror::Error)]
#[error("reading the token file {path}: {source}")]
pub struct TokenError {
    /// The token file.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Where the ACL token comes from.
#[derive(Debug)]
pub enum TokenSource {
    /// No token: the agent's default token applies.
    None,
    /// A token given once (`CONSUL_HTTP_TOKEN`).
    Fixed(Secret),
    /// A token file, re-read when its stamp changes.
    File {
        /// The file.
        path: PathBuf,
        /// The last version read.
        cached: Mutex<Option<(FileStamp, Option<Secret>)>>,
    },
}

impl TokenSource {
    /// The file wins over the environment, as for the consul CLI.
    pub fn new(file: Option<&Path>, env: Option<String>) -> Result<Self, TokenError> {
        let source = match (file, env) {
            (Some(path), _) => Self::File {
                path: path.to_path_buf(),
                cached: Mutex::new(None),
            },
            (None, Some(t)) if !t.trim().is_empty() => Self::Fixed(Secret::new(t.trim())),
            (None, _) => Self::None,
        };
        // A missing file is a startup error, not a surprise at the first request.
        source.current()?;
        Ok(source)
    }

    /// The token to send now (re-reading the file if it changed since the last call).
    pub fn current(&self) -> Result<Option<Secret>, TokenError> {
        match self {
            Self::None => Ok(None),
            Self::Fixed(s) => Ok(Some(s.clone())),
            Self::File { path, cached } => {
                let stamp = FileStamp::of(path);
                let mut cached = cached.lock().unwrap_or_else(|p| p.into_inner());
                if let (Some(now), Some((seen, token))) = (stamp, cached.as_ref()) {
                    if now == *seen {
                        return Ok(token.clone());
                    }
                }
                let bytes = std::fs::read(path).map_err(|source| TokenError {
                    path: path.clone(),
                    source,
                })?;
                let text = String::from_utf8_lossy(&bytes).trim().to_string();
                let token = (!text.is_empty()).then(|| Secret::new(text));
                if cached.is_some() {
                    tracing::info!(path = %path.display(), "Consul token file changed; using the new token.");
                }
                if let Some(stamp) = stamp {
                    *cached = Some((stamp, token.clone()));
                }
                Ok(token)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("s3cr3t-token");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{s}"), "***");
        let src = TokenSource::Fixed(s);
        assert!(!format!("{src:?}").contains("s3cr3t"), "{src:?}");
    }

    #[test]
    fn token_file_is_reread_when_it_changes() {
        let dir = tempfile_dir();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").expect("write");
        let src = TokenSource::new(Some(&path), Some("ignored".into())).expect("source");
        assert_eq!(src.current().expect("token"), Some(Secret::new("first")));
        std::fs::write(&path, "second-token").expect("write");
        assert_eq!(
            src.current().expect("token"),
            Some(Secret::new("second-token"))
        );
        assert!(!format!("{src:?}").contains("second"), "{src:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_token_file_fails_at_startup() {
        let e = TokenSource::new(Some(Path::new("/nonexistent/token")), None)
            .expect_err("missing file");
        assert!(e.to_string().contains("/nonexistent/token"), "{e}");
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "adapter-consul-secret-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }
}
