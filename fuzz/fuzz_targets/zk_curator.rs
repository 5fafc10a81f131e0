//! Curator x-discovery / Spring Cloud Zookeeper / Dubbo 3 instances as ZooKeeper holds them:
//! `service NUL id NUL data NUL id NUL data ...`, each data the instance's JSON
//! (`{root}/{service}/{id}`). Through the adapter's conversion of one directory (which decodes
//! each instance, and a Dubbo 3 instance's `dubbo.endpoints`), the assembly and translation.
#![no_main]

use adapter_zookeeper::assemble::assemble;
use adapter_zookeeper::convert::convert_curator;
use adapter_zookeeper::{DubboDiscovery, ZookeeperRegistry};
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::{parts, serve};

fuzz_target!(|data: &[u8]| {
    let p = parts(data);
    let Some((name, rest)) = p.split_first() else {
        return;
    };
    let name = String::from_utf8_lossy(name);
    let ids: Vec<String> = rest
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c[0]).into_owned())
        .collect();
    let instances = rest
        .chunks(2)
        .zip(&ids)
        .map(|(c, id)| (id.as_str(), c.get(1).copied().unwrap_or_default()));
    let c = convert_curator("/services", &name, instances);
    let dirs = [("/services", &c, None)];
    let a = assemble(dirs, DubboDiscovery::default(), &Default::default());
    serve::<ZookeeperRegistry>(a.services.into_values().map(|b| b.service.into_owned()));
});
