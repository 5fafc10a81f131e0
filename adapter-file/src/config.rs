//! Flags of the file adapter (the shared ones are in [`mcp_runtime::CommonArgs`]).

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::parse;

/// What to watch, how often, and how far to trust what is found there.
#[derive(Clone, Debug, clap::Args)]
pub struct FileConfig {
    /// File or directory to serve (repeatable, or comma-separated in the environment variable).
    /// Directories are scanned recursively for *.yaml, *.yml and *.json, skipping entries whose
    /// names start with `.` (Kubernetes ConfigMap mounts keep older copies in `..data` folders).
    /// When two files define the same namespace/name, the first path (then document) wins.
    #[arg(
        long = "path",
        env = "MCP_FILE_PATH",
        value_delimiter = ',',
        required = true
    )]
    pub paths: Vec<PathBuf>,

    /// How often every path is checked for changes (`500ms`, `1s`). Polling rather than inotify
    /// works the same on ConfigMap symlink swaps, network file systems and every OS.
    #[arg(
        long,
        env = "MCP_FILE_POLL_INTERVAL",
        default_value = "1s",
        value_parser = parse::duration
    )]
    pub poll_interval: Duration,

    /// Longest a single file read may take (`5s`). A read that takes longer (a hung network
    /// mount) is reported as a problem and the file keeps its last good content; other files
    /// keep reloading.
    #[arg(
        long,
        env = "MCP_FILE_READ_TIMEOUT",
        default_value = "5s",
        value_parser = parse::duration
    )]
    pub read_timeout: Duration,

    /// Largest file that is read (`16MiB`, `512KiB`, or bytes). Bigger files are reported as a
    /// problem instead of being loaded into memory.
    #[arg(
        long,
        env = "MCP_FILE_MAX_SIZE",
        default_value = "16MiB",
        value_parser = parse::size
    )]
    pub max_file_size: u64,

    /// How long a new version of a file that would remove services (an empty file, fewer
    /// documents) or no longer parses must stay unchanged before it is applied (`2s`; `0`
    /// applies it at once). Editors and `kubectl cp` truncate before they write: this keeps
    /// services from disappearing for a poll in the middle of such a write.
    #[arg(
        long,
        env = "MCP_FILE_SETTLE_TIME",
        default_value = "2s",
        value_parser = parse::duration
    )]
    pub settle_time: Duration,
}

/// Why a [`FileConfig`] cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Nothing to watch (possible when the config is built in code rather than by clap).
    #[error("no --path given: name at least one file or directory to serve")]
    NoPaths,
    /// A zero interval would turn the watcher into a busy loop.
    #[error("--poll-interval must be greater than 0")]
    ZeroPollInterval,
    /// A zero timeout would fail every read.
    #[error("--read-timeout must be greater than 0")]
    ZeroReadTimeout,
    /// A zero limit would refuse every file.
    #[error("--max-file-size must be greater than 0")]
    ZeroMaxFileSize,
}

impl FileConfig {
    /// A configuration with the flags' defaults, for `paths` (used by tests and embedders).
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Self {
            paths,
            poll_interval: Duration::from_secs(1),
            read_timeout: Duration::from_secs(5),
            max_file_size: 16 << 20,
            settle_time: Duration::from_secs(2),
        }
    }

    /// Checks what clap cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.paths.is_empty() {
            return Err(ConfigError::NoPaths);
        }
        if self.poll_interval.is_zero() {
            return Err(ConfigError::ZeroPollInterval);
        }
        if self.read_timeout.is_zero() {
            return Err(ConfigError::ZeroReadTimeout);
        }
        if self.max_file_size == 0 {
            return Err(ConfigError::ZeroMaxFileSize);
        }
        Ok(())
    }
}

/// What `main` runs: these flags build a [`FileRegistry`](crate::registry::FileRegistry).
impl mcp_runtime::entry::AdapterConfig for FileConfig {
    type Registry = crate::registry::FileRegistry;
    type Error = ConfigError;
    const NAME: &'static str = env!("CARGO_PKG_NAME");
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const ABOUT: &'static str =
        "Serves Istio ServiceEntries from Istio YAML/JSON files and compact inventories over MCP.";

    async fn registry(self) -> Result<Self::Registry, Self::Error> {
        crate::registry::FileRegistry::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        file: FileConfig,
    }

    #[test]
    fn parses_repeated_paths_and_interval() {
        let cli = Cli::try_parse_from([
            "adapter-file",
            "--path",
            "a.yaml",
            "--path",
            "dir,b.json",
            "--poll-interval",
            "250ms",
        ])
        .expect("parses");
        assert_eq!(
            cli.file.paths,
            vec![
                PathBuf::from("a.yaml"),
                PathBuf::from("dir"),
                PathBuf::from("b.json")
            ]
        );
        assert_eq!(cli.file.poll_interval, Duration::from_millis(250));
        assert_eq!(cli.file.validate(), Ok(()));
    }

    #[test]
    fn defaults_match_new() {
        let cli = Cli::try_parse_from(["adapter-file", "--path", "a"]).expect("parses");
        let new = FileConfig::new(vec!["a".into()]);
        assert_eq!(cli.file.read_timeout, new.read_timeout);
        assert_eq!(cli.file.max_file_size, new.max_file_size);
        assert_eq!(cli.file.settle_time, new.settle_time);
        assert_eq!(cli.file.poll_interval, new.poll_interval);
    }

    #[test]
    fn validation() {
        assert!(
            Cli::try_parse_from(["adapter-file", "--poll-interval", "fast", "--path", "a"])
                .is_err()
        );
        let config = FileConfig::new(vec![]);
        assert_eq!(config.validate(), Err(ConfigError::NoPaths));
        let config = FileConfig {
            poll_interval: Duration::ZERO,
            ..FileConfig::new(vec!["a".into()])
        };
        assert_eq!(config.validate(), Err(ConfigError::ZeroPollInterval));
        let config = FileConfig {
            read_timeout: Duration::ZERO,
            ..FileConfig::new(vec!["a".into()])
        };
        assert_eq!(config.validate(), Err(ConfigError::ZeroReadTimeout));
        let config = FileConfig {
            max_file_size: 0,
            ..FileConfig::new(vec!["a".into()])
        };
        assert_eq!(config.validate(), Err(ConfigError::ZeroMaxFileSize));
    }

    #[test]
    fn flags_are_consistent() {
        mcp_runtime::entry::command::<FileConfig>().debug_assert();
    }
}
