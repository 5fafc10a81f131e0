//! Eureka's `GET /apps/delta` applied onto the copy a `GET /apps` made: `full NUL delta` (with
//! no NUL, the delta applies to an empty registry). Then what the watch sends for the apps the
//! delta touched: each converted and translated, or gone.
#![no_main]

use adapter_eureka::convert::convert_app;
use adapter_eureka::dto::decode;
use adapter_eureka::state::LocalRegistry;
use adapter_eureka::EurekaRegistry;
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::{check_local, serve};

fuzz_target!(|data: &[u8]| {
    let (full, delta) = match data.iter().position(|b| *b == 0) {
        Some(i) => (Some(&data[..i]), &data[i + 1..]),
        None => (None, data),
    };
    let mut local = match full.map(decode) {
        Some(Ok(apps)) => LocalRegistry::from_full(apps),
        Some(Err(_)) => return,
        None => LocalRegistry::default(),
    };
    let Ok(delta) = decode(delta) else {
        return;
    };
    let touched = local.apply_delta(delta.clone());
    check_local(&local);
    // A delta applied twice changes nothing more (the server may send one again after a
    // failed fetch): the same instances, the same hash.
    let once = local.reconcile_hash();
    let count = local.instance_count();
    let mut again = local.clone();
    again.apply_delta(delta);
    assert_eq!(again.reconcile_hash(), once, "a delta applied twice");
    assert_eq!(again.instance_count(), count, "a delta applied twice");
    for name in &touched {
        if let Some(insts) = local.app(name) {
            serve::<EurekaRegistry>(convert_app(name, insts).service);
        }
    }
});
