//! File adapter: serves Istio ServiceEntries written as Istio YAML/JSON or as a compact
//! inventory (see README.md) from files and directories, re-read when they change.
//!
//! [`convert`] turns one file's text into services, [`registry`] polls the paths and implements
//! [`mcp_core::Registry`], [`config`] holds the flags. Validation beyond shape is left to the core.

pub mod config;
pub mod convert;
pub mod registry;

pub use config::{ConfigError, FileConfig};
pub use convert::{parse, ConvertError, Format};
pub use registry::{FileError, FileRegistry};
