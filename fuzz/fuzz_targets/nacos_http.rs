//! Nacos' HTTP answers through the adapter's decode of each: the login, the namespace lists,
//! 2.x's catalog pages, 3.x's admin pages and the message of an error answer. Every service a
//! page lists is then named with the others (no two may share a name), converted with one
//! instance and translated.
#![no_main]

use adapter_nacos::convert::ServiceId;
use adapter_nacos::dto::{AdminServicePage, CatalogPage, Login, Namespaces};
use adapter_nacos::http::{decode, error_message, namespace_ids, Page};
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::{nacos_one_instance, nacos_serve};

fn serve_page(page: &Page) {
    let ids: Vec<ServiceId> = page
        .names
        .iter()
        .take(64)
        .map(|(g, n)| ServiceId::new("public", g, n))
        .collect();
    nacos_serve(&ids, |_| nacos_one_instance());
}

fuzz_target!(|data: &[u8]| {
    let _ = decode::<Login>(data);
    if let Ok(ns) = decode::<Namespaces>(data) {
        let ids = namespace_ids(ns);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "namespace ids unsorted"
        );
        assert!(ids.iter().all(|i| !i.is_empty()), "an empty namespace id");
    }
    if let Ok(p) = decode::<CatalogPage>(data) {
        serve_page(&Page::console(&p));
    }
    if let Ok(p) = decode::<AdminServicePage>(data) {
        if let Ok(page) = Page::admin(p) {
            serve_page(&page);
        }
    }
    let message = error_message(data);
    // Clipped: an error answer's message goes into logs and the problems page.
    assert!(message.len() <= 256, "error message not clipped");
});
