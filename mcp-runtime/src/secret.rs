//! Credentials: a [`Secret`] that never prints, and [`SecretSource`], where one comes from (an
//! environment variable read once, or a file re-read when it changes, so a rotated token,
//! password or digest is picked up without a restart). Every adapter's credentials go through
//! here: Consul's ACL token, Eureka's basic auth, ZooKeeper's digest.

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

/// Why a secret cannot be had.
#[derive(Debug, thiserror::Error)]
#[error("reading the {what} file {path}: {source}")]
pub struct SecretError {
    /// What the file holds (`token`, `credentials`).
    pub what: &'static str,
    /// The file.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Where a secret comes from.
#[derive(Debug)]
pub enum SecretSource {
    /// None given.
    None,
    /// A value given once (an environment variable).
    Fixed(Secret),
    /// A file, re-read when its stamp changes; surrounding whitespace is trimmed and an empty
    /// file is no secret.
    File {
        /// What it holds, for messages (`token`, `credentials`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The last version read.
        cached: Mutex<Option<(FileStamp, Option<Secret>)>>,
    },
}

impl SecretSource {
    /// The file wins over the environment value (as for the consul CLI); an empty value is
    /// none. Fails now when the file cannot be read: a startup error, not a surprise at the
    /// first request.
    pub fn new(
        what: &'static str,
        file: Option<&Path>,
        env: Option<String>,
    ) -> Result<Self, SecretError> {
        let source = match (file, env) {
            (Some(path), _) => Self::File {
                what,
                path: path.to_path_buf(),
                cached: Mutex::new(None),
            },
            (None, Some(v)) if !v.trim().is_empty() => Self::Fixed(Secret::new(v.trim())),
            (None, _) => Self::None,
        };
        source.current()?;
        Ok(source)
    }

    /// The secret to use now (re-reading the file if it changed since the last call).
    pub fn current(&self) -> Result<Option<Secret>, SecretError> {
        match self {
            Self::None => Ok(None),
            Self::Fixed(s) => Ok(Some(s.clone())),
            Self::File { what, path, cached } => {
                let stamp = FileStamp::of(path);
                let mut cached = cached.lock().unwrap_or_else(|p| p.into_inner());
                if let (Some(now), Some((seen, secret))) = (stamp, cached.as_ref()) {
                    if now == *seen {
                        return Ok(secret.clone());
                    }
                }
                let bytes = std::fs::read(path).map_err(|source| SecretError {
                    what,
                    path: path.clone(),
                    source,
                })?;
                let text = String::from_utf8_lossy(&bytes).trim().to_string();
                let secret = (!text.is_empty()).then(|| Secret::new(text));
                if cached.is_some() {
                    tracing::info!(path = %path.display(), "The {what} file changed; using the new {what}.");
                }
                if let Some(stamp) = stamp {
                    *cached = Some((stamp, secret.clone()));
                }
                Ok(secret)
            }
        }
    }

    /// Whether the secret comes from a file (and may change).
    pub fn is_file(&self) -> bool {
        matches!(self, Self::File { .. })
    }
}

/// Why `user:password` credentials are unusable.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {path}: {message}")]
pub struct CredentialsError {
    /// The file flag (`--eureka-auth-file`).
    pub flag: &'static str,
    /// The file, or the two variables' names when they are the source.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

/// `user:password` for a registry's login: from the file named by a flag (re-read when it
/// changes, so a rotated password needs no restart), else from two environment variables.
/// Never printed: the pair is a [`Secret`] until the request takes it.
#[derive(Debug)]
pub struct UserPassword {
    source: SecretSource,
    flag: &'static str,
    vars: &'static str,
}

impl UserPassword {
    /// From `file` (flag `flag`), else `user_var` and `password_var`; none when neither is
    /// set. A file that cannot be read or does not hold `user:password` fails now.
    pub fn load(
        flag: &'static str,
        file: Option<&Path>,
        (user_var, password_var): (&'static str, &'static str),
        vars: &'static str,
    ) -> Result<Self, CredentialsError> {
        let env = match (std::env::var(user_var), std::env::var(password_var)) {
            (Ok(user), Ok(password)) if !user.is_empty() => Some(format!("{user}:{password}")),
            _ => None,
        };
        let source = SecretSource::new("credentials", file, env).map_err(|e| CredentialsError {
            flag,
            path: e.path.clone(),
            message: e.source.to_string(),
        })?;
        Self::from_source(source, flag, vars)
    }

    /// From `source` (tests: a fixed pair); checked now.
    pub fn from_source(
        source: SecretSource,
        flag: &'static str,
        vars: &'static str,
    ) -> Result<Self, CredentialsError> {
        let creds = Self { source, flag, vars };
        creds.current()?;
        Ok(creds)
    }

    /// The user and password to send now.
    pub fn current(&self) -> Result<Option<(String, Secret)>, CredentialsError> {
        let bad = |message: String| CredentialsError {
            flag: self.flag,
            path: match &self.source {
                SecretSource::File { path, .. } => path.clone(),
                _ => PathBuf::from(self.vars),
            },
            message,
        };
        let Some(pair) = self
            .source
            .current()
            .map_err(|e| bad(e.source.to_string()))?
        else {
            return Ok(None);
        };
        let (user, password) = pair
            .expose()
            .split_once(':')
            .ok_or_else(|| bad("expected one line `user:password`".into()))?;
        Ok(Some((user.to_string(), Secret::new(password))))
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
        let src = SecretSource::Fixed(s);
        assert!(!format!("{src:?}").contains("s3cr3t"), "{src:?}");
    }

    #[test]
    fn a_file_is_reread_when_it_changes_and_wins_over_the_environment() {
        let dir = temp_dir();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").expect("write");
        let src = SecretSource::new("token", Some(&path), Some("ignored".into())).expect("source");
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
    fn a_missing_file_fails_at_startup_and_blank_values_are_none() {
        let e = SecretSource::new("token", Some(Path::new("/nonexistent/token")), None)
            .expect_err("missing file");
        assert!(e.to_string().contains("/nonexistent/token"), "{e}");
        assert!(e.to_string().contains("token file"), "{e}");
        let src = SecretSource::new("token", None, Some("  ".into())).expect("source");
        assert_eq!(src.current().expect("none"), None);
    }

    fn temp_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "mcp-core-secret-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }
}
