//! Dubbo providers as ZooKeeper names them: `interface NUL znode NUL znode ...`, each znode the
//! form-encoded provider URL (`{root}/{interface}/providers/{url}`). Through the adapter's
//! conversion of one interface's providers (which decodes and parses each name), then the
//! assembly of what is served and the core's translation.
#![no_main]

use adapter_zookeeper::assemble::assemble;
use adapter_zookeeper::convert::convert_dubbo;
use adapter_zookeeper::dto::{form_decode, form_encode, parse_url};
use adapter_zookeeper::filter::Filters;
use adapter_zookeeper::{DubboDiscovery, ZookeeperRegistry};
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::{parts, serve};

fuzz_target!(|data: &[u8]| {
    let p = parts(data);
    let Some((interface, znodes)) = p.split_first() else {
        return;
    };
    let interface = String::from_utf8_lossy(interface);
    let providers: Vec<String> = znodes
        .iter()
        .map(|z| String::from_utf8_lossy(z).into_owned())
        .collect();
    for z in &providers {
        // What a writer encodes, the adapter decodes back.
        assert_eq!(form_decode(&form_encode(z)).as_deref(), Ok(z.as_str()));
        if let Ok(url) = form_decode(z).and_then(|u| parse_url(&u)) {
            assert!(!url.host.is_empty(), "{z:?}: a provider URL without a host");
        }
    }
    let c = convert_dubbo("/dubbo", &interface, &providers, &Filters::default());
    let dirs = [("/dubbo", &c, None)];
    let a = assemble(dirs, DubboDiscovery::default(), &Default::default());
    serve::<ZookeeperRegistry>(a.services.into_values().map(|b| b.service.into_owned()));
});
