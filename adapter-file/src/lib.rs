//! File adapter: serves Istio ServiceEntries written as Istio YAML/JSON or as a compact
//! inventory (see README.md) from files and directories, re-read when they change.
//!
//! [`convert`] turns one file's text into services; [`walk`] lists the configured paths,
//! [`read`] reads one file without letting it stall the watcher, [`file_state`] decides what a
//! new read of one file does to what it serves, [`slots`] keeps every listed file's id and
//! state, [`scanner`] polls them all, [`served`] picks the definition served for each key and
//! works out what a change to some files changes, and [`registry`] runs it and implements
//! [`mcp_core::Registry`]; [`config`] holds the flags. Validation beyond shape is left to the
//! core.

pub mod config;
pub mod convert;
pub mod file_state;
pub mod read;
pub mod registry;
pub mod scanner;
pub mod served;
pub mod slots;
#[cfg(test)]
mod test_support;
pub mod walk;

pub use config::{ConfigError, FileConfig};
pub use convert::{parse, ConvertError, Format};
pub use file_state::FileError;
pub use registry::FileRegistry;
