//! `--state-file` as an adapter reads it at start (`mcp_core::cache::state_file::load`), on any
//! bytes.
//!
//! Invariants: no panic (a corrupt file is an error naming the file); a file that loads saves
//! (`save`) to one that loads to the same set: the same entries (names, versions, resources),
//! the same snapshot version and the same quarantine, and saving that again writes the same
//! bytes.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mcp_core::cache::state_file::{load, save, Saved, StateFileError};

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
}

fn path(name: &str) -> PathBuf {
    dir().path().join(name)
}

fn entries(s: &Saved) -> Vec<(String, String, Vec<u8>)> {
    s.snapshot
        .iter()
        .map(|e| {
            (
                e.name.to_string(),
                e.version.to_string(),
                e.resource.to_vec(),
            )
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let input = path("state");
    std::fs::write(&input, data).expect("write the input");
    let saved = match load(&input) {
        Ok(Some(saved)) => saved,
        Ok(None) => panic!("a file that exists loaded as none"),
        Err(e @ StateFileError::Corrupt { .. }) => {
            assert!(e.to_string().contains(&input.display().to_string()), "{e}");
            return;
        }
        Err(e) => panic!("reading a regular file failed: {e}"),
    };
    let again = path("again");
    save(&again, &saved.snapshot, &saved.vip_quarantine).expect("a loaded state saves");
    let reloaded = load(&again)
        .expect("a saved state loads")
        .expect("a saved state exists");
    assert_eq!(entries(&saved), entries(&reloaded), "the entries changed");
    assert_eq!(saved.snapshot.version, reloaded.snapshot.version);
    assert_eq!(
        saved.vip_quarantine, reloaded.vip_quarantine,
        "the quarantine changed"
    );
    let third = path("third");
    save(&third, &reloaded.snapshot, &reloaded.vip_quarantine).expect("saves again");
    let (a, b) = (
        std::fs::read(&again).expect("read"),
        std::fs::read(&third).expect("read"),
    );
    assert!(a == b, "saving a reloaded state wrote other bytes");
});
