//! What a Nacos server sends over gRPC: a `Payload` (protobuf, decoded by the same prost
//! decode tonic's codec calls), its JSON read as the session reads it: as a request the server
//! pushes (`NotifySubscriberRequest` and the connection requests, `ServerRequest::parse`) and as
//! the answers to the session's requests (`ResponseBody`: subscriptions and checks;
//! `ServiceNames`: service lists). A service read from it is named, converted and translated.
#![no_main]

use adapter_nacos::convert::ServiceId;
use adapter_nacos::dto::{ResponseBody, ServerRequest, ServiceInfo, ServiceNames};
use adapter_nacos::wire::Payload;
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::{nacos_one_instance, nacos_serve};
use prost::Message;

fn serve_info(info: &ServiceInfo) {
    let (group, name) = info.group_and_name();
    let id = ServiceId::new("public", &group, &name);
    nacos_serve(std::slice::from_ref(&id), |_| info.clone());
}

fuzz_target!(|data: &[u8]| {
    let Ok(payload) = Payload::decode(data) else {
        return;
    };
    let _ = payload.kind();
    if let Ok(request) = ServerRequest::parse(payload.json()) {
        if let Some(Ok(info)) = &request.service_info {
            serve_info(info);
        }
    }
    if let Ok(body) = payload.parse::<ResponseBody>("SubscribeServiceRequest") {
        if let Some(info) = &body.service_info {
            serve_info(info);
        }
    }
    if let Ok(names) = payload.parse::<ServiceNames>("ServiceListRequest") {
        let ids: Vec<ServiceId> = names
            .service_names
            .iter()
            .take(64)
            .map(|n| ServiceId::new("public", "DEFAULT_GROUP", n))
            .collect();
        nacos_serve(&ids, |_| nacos_one_instance());
    }
});
