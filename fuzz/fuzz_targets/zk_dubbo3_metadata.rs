//! A ZooKeeper registry with Dubbo interfaces and Dubbo 3 applications side by side (dual
//! registration: the same provider under its interface and under its application), as lines:
//!
//! ```text
//! interface|application|both        the --dubbo-discovery mode
//! D com.example.Greeter             an interface directory, /dubbo/{interface}/providers
//! P dubbo%3A%2F%2F10.0.0.1...       one of its providers' znode names
//! A greeter-app                     an application directory, /services/{app}
//! I {id} {json}                     one of its instances (id, then the instance's JSON)
//! ```
//!
//! Each directory converted as the watch does, all assembled together (name collisions, dual
//! registration), and what is served translated.
#![no_main]

use std::collections::BTreeSet;

use adapter_zookeeper::assemble::assemble;
use adapter_zookeeper::convert::{convert_curator, convert_dubbo, Converted};
use adapter_zookeeper::filter::Filters;
use adapter_zookeeper::{DubboDiscovery, ZookeeperRegistry};
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::serve;

enum Dir<'a> {
    Interface(&'a str, Vec<String>),
    App(&'a str, Vec<(&'a str, &'a str)>),
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.lines();
    let discovery = match lines.next() {
        Some("application") => DubboDiscovery::Application,
        Some("both") => DubboDiscovery::Both,
        _ => DubboDiscovery::Interface,
    };
    let mut dirs: Vec<Dir<'_>> = Vec::new();
    for line in lines.take(256) {
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        match (tag, dirs.last_mut()) {
            ("D", _) => dirs.push(Dir::Interface(rest, Vec::new())),
            ("A", _) => dirs.push(Dir::App(rest, Vec::new())),
            ("P", Some(Dir::Interface(_, providers))) => providers.push(rest.to_string()),
            ("I", Some(Dir::App(_, instances))) => {
                instances.push(rest.split_once(' ').unwrap_or((rest, "")))
            }
            _ => {}
        }
    }
    let filters = Filters::default();
    let converted: Vec<(String, Converted)> = dirs
        .iter()
        .map(|d| match d {
            Dir::Interface(name, providers) => (
                format!("/dubbo/{name}/providers"),
                convert_dubbo("/dubbo", name, providers, &filters),
            ),
            Dir::App(name, instances) => (
                format!("/services/{name}"),
                convert_curator(
                    "/services",
                    name,
                    instances.iter().map(|(id, json)| (*id, json.as_bytes())),
                ),
            ),
        })
        .collect();
    let a = assemble(
        converted.iter().map(|(scope, c)| (scope.as_str(), c, None)),
        discovery,
        &BTreeSet::new(),
    );
    for key in a.services.keys() {
        assert!(!a.hidden.contains(key), "{key:?} both hidden and served");
    }
    serve::<ZookeeperRegistry>(a.services.into_values().map(|b| b.service.into_owned()));
});
