//! Helpers shared by the tests of the scanner and of the per-file state: a [`Scanner`] over
//! real files in a temporary directory, and what it serves and reports.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tempfile::TempDir;

use crate::scanner::{Limits, Scanner};

pub(crate) const LIMITS: Limits = Limits {
    read_timeout: Duration::from_secs(5),
    max_file_size: 1024 * 1024,
    settle: Duration::ZERO,
};

pub(crate) fn se(name: &str, port: u32) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}}}\n\
         spec:\n  hosts: [{name}.example.com]\n  ports: [{{number: {port}, name: http}}]\n"
    )
}

pub(crate) fn write(path: &Path, text: &str) {
    fs::write(path, text).expect("write test file");
}

pub(crate) fn names(scanner: &Scanner) -> Vec<String> {
    scanner.served().iter().map(|s| s.key.to_string()).collect()
}

pub(crate) fn problems(scanner: &Scanner) -> String {
    format!("{:?}", scanner.problems())
}

pub(crate) fn set_mtime(path: &Path, mtime: SystemTime) {
    fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
}

/// A scanner of one file, `a.yaml` in a fresh directory (kept while the first value lives),
/// that has scanned it once: it serves `web` on port 80.
pub(crate) fn one_file() -> (TempDir, PathBuf, Scanner) {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    write(&a, &se("web", 80));
    let mut scanner = Scanner::new(vec![a.clone()], LIMITS);
    assert!(scanner.scan().changed());
    (dir, a, scanner)
}
