//! Flags of the file adapter (the shared ones are in [`mcp_core::CommonArgs`]).

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::cli::parse_duration;

/// What to watch and how often.
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
        value_parser = parse_duration
    )]
    pub poll_interval: Duration,
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
}

impl FileConfig {
    /// Checks what clap cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.paths.is_empty() {
            return Err(ConfigError::NoPaths);
        }
        if self.poll_interval.is_zero() {
            return Err(ConfigError::ZeroPollInterval);
        }
        Ok(())
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
    fn validation() {
        assert!(
            Cli::try_parse_from(["adapter-file", "--poll-interval", "fast", "--path", "a"])
                .is_err()
        );
        let config = FileConfig {
            paths: vec![],
            poll_interval: Duration::from_secs(1),
        };
        assert_eq!(config.validate(), Err(ConfigError::NoPaths));
        let config = FileConfig {
            paths: vec!["a".into()],
            poll_interval: Duration::ZERO,
        };
        assert_eq!(config.validate(), Err(ConfigError::ZeroPollInterval));
    }
}
