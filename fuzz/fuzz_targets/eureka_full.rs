//! Eureka's `GET /apps` answer through the adapter's decode, the local copy a full fetch makes,
//! the conversion of each app and the core's translation.
#![no_main]

use adapter_eureka::convert::convert_app;
use adapter_eureka::dto::decode;
use adapter_eureka::state::LocalRegistry;
use adapter_eureka::EurekaRegistry;
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::{check_local, serve};

fuzz_target!(|data: &[u8]| {
    let Ok(apps) = decode(data) else {
        return;
    };
    let local = LocalRegistry::from_full(apps);
    check_local(&local);
    for name in local.app_names() {
        if let Some(insts) = local.app(name) {
            serve::<EurekaRegistry>(convert_app(name, insts).service);
        }
    }
});
