//! The churn soak with faults (issue #46 item 3): every registry driven at a set rate with a
//! seeded generator, faults injected (an adapter SIGKILLed, the adapter's connection to its
//! registry cut, istiod's connection to an adapter cut, a registry restarted, istiod restarted),
//! and at each quiet point istiod (configz, endpointShardz) and Envoy (EDS) compared with what
//! each registry itself holds. See `e2e::soak` for the harness.
//!
//! Short run (the default, about 4 minutes with startup): every kind of fault once.
//! A long run: `SOAK_DURATION=60m SOAK_RATE=20 SOAK_FAULT_EVERY=60s SOAK_SEED=7
//! cargo test -p e2e --test soak -- --include-ignored --nocapture`
//! (`SOAK_REGISTRIES=consul,file,kube` for fewer registries, `SOAK_BOUND=45s` the time
//! allowed to converge after a fault heals, `SOAK_BREAK=1` drops one endpoint from the truth to
//! show that the comparison catches it). The summary goes to `target/soak-report.json`.

use e2e::soak::world::World;
use e2e::soak::SoakConfig;

#[test]
#[ignore = "starts every registry, istiod and Envoy and runs for minutes (the soak)"]
fn churn_with_faults_converges_and_stays_flat() {
    let cfg = SoakConfig::from_env();
    eprintln!("soak: {cfg:?}");
    let mut world = World::start(cfg);
    world.run();
    let report = &world.report;
    let path = report.write();
    eprintln!("soak: report written to {}", path.display());
    let divergences = report.divergences();
    assert!(
        divergences.is_empty(),
        "{} quiet point(s) did not converge within the bound: {:#?}",
        divergences.len(),
        divergences
    );
    assert!(
        report.metric_failures.is_empty(),
        "adapter metric checks failed: {:#?}",
        report.metric_failures
    );
    assert!(
        report.heap_failures.is_empty(),
        "adapter heap not flat: {:#?}",
        report.heap_failures
    );
    assert!(report.total_ops() > 0, "no operation was issued");
}
