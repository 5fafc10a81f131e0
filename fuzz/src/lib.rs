//! What every fuzz target checks besides "no panic": the invariants of what the adapters serve.
//! The targets live in `fuzz_targets/`, one per decoder; scripts/fuzz.sh builds and runs them.

use mcp_core::translate::{istio_rules, Translated};

pub mod io;
pub mod registries;

/// Panics (a libFuzzer finding) when a translated entry is one istiod would not accept: the
/// adapters must drop or fix what is invalid before serving, never pass it on. The rules are
/// Istio's own `ValidateServiceEntry`, mirrored in `istio_rules` and held equal to the Go code by
/// tests/tests/istio_validation.rs.
pub fn check_served(t: &Translated) {
    let namespace = t.name.split_once('/').map_or("", |(ns, _)| ns);
    if let Err(errors) = istio_rules::check(&t.service_entry(), namespace) {
        panic!(
            "{} would be served but Istio refuses it: {errors:?}\n{:#?}",
            t.name,
            t.service_entry()
        );
    }
}
