//! `--shards S`: one process, one registry watch, S sources on S ports. Each shard is a whole
//! MCP source (every type answered, health, metrics), serves exactly the services
//! `--shard i/S` serves (with the same snapshot version, so moving from S processes to one keeps
//! istiod's view unchanged), and a change reaches only the shard that holds it. Default flags
//! otherwise (coalescing on).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use common::*;
use mcp_core::model::ServiceKey;
use mcp_core::registry::RegistryEvent;
use mcp_core::shard::{shard_of, ShardIndex};
use mcp_core::testing::mk_service;
use mcp_runtime::testing::test_args;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const SHARDS: usize = 3;

fn services() -> Vec<mcp_core::model::Service> {
    (0..30)
        .map(|i| mk_service(&format!("svc-{i:02}"), 1))
        .collect()
}

/// The names and snapshot version one SotW request to `addr` returns (the stream stays open).
async fn served_at(
    a: &Adapter,
    addr: SocketAddr,
) -> (
    Raw<
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest,
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse,
    >,
    Vec<String>,
    String,
) {
    let mut s = a.xds_at(addr).await;
    s.send(xds_req(SE_V1, ""));
    let r = s.recv().await;
    s.send(xds_ack(&r));
    let served = names(&decode_xds(&r));
    (s, served, r.version_info)
}

/// Waits until the adapter's /debug/resources lists every shard as published.
async fn wait_shards_published(a: &Adapter) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let d = a.debug().await;
        let published = d["shards"]
            .as_array()
            .is_some_and(|s| s.len() == SHARDS && s.iter().all(|s| s["version"].is_string()));
        if published {
            return d;
        }
        assert!(tokio::time::Instant::now() < deadline, "{d}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn one_process_serves_the_split_of_separate_shard_processes() {
    let mut args = test_args();
    args.shards = SHARDS as u16;
    let a = Adapter::start_with(args).await;
    assert_eq!(a.running.grpc_addrs.len(), SHARDS, "one port per shard");
    a.handle.send(RegistryEvent::Reset(services()));
    let debug = wait_shards_published(&a).await;

    let mut streams = Vec::new();
    let mut union = Vec::new();
    for (i, addr) in a.running.grpc_addrs.clone().into_iter().enumerate() {
        let (stream, served, version) = served_at(&a, addr).await;
        assert!(!served.is_empty(), "shard {i} holds a share of 30");
        for name in &served {
            let key = ServiceKey::new(name.trim_start_matches("fake/"));
            assert_eq!(shard_of(&key, SHARDS), i, "{name} is in its hash's shard");
        }
        assert_eq!(debug["shards"][i]["address"], addr.to_string());
        assert_eq!(debug["shards"][i]["resources"], served.len());
        assert_eq!(debug["shards"][i]["version"], version);

        // The same shard served by a process of its own (`--shard i/3`): same set, same version.
        let mut alone_args = test_args();
        alone_args.shard = Some(ShardIndex {
            index: i as u64,
            count: SHARDS as u64,
        });
        let alone = Adapter::start_with(alone_args).await;
        alone.handle.send(RegistryEvent::Reset(services()));
        alone
            .wait_served(&served.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
        let (_, alone_served, alone_version) = served_at(&alone, alone.grpc()).await;
        assert_eq!(
            alone_served, served,
            "shard {i}: same services as --shard {i}/3"
        );
        assert_eq!(alone_version, version, "shard {i}: same snapshot version");
        alone.stop().await;

        union.extend(served);
        streams.push(stream);
    }
    union.sort();
    let all: Vec<String> = (0..30).map(|i| format!("fake/svc-{i:02}")).collect();
    assert_eq!(
        union, all,
        "the shards are disjoint and cover every service"
    );

    // Every shard is a whole source: other types are answered (empty), health is served.
    for addr in &a.running.grpc_addrs {
        let mut s = a.xds_at(*addr).await;
        s.send(xds_req("networking.istio.io/v1/DestinationRule", ""));
        let r = s.recv().await;
        assert!(r.resources.is_empty(), "{r:?}");
        let mut health = HealthClient::new(channel_to(*addr).await);
        let status = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        assert_eq!(status, 1, "SERVING on {addr}");
    }

    // A change reaches only the shard that holds it.
    let changed = ServiceKey::new("svc-07");
    let home = shard_of(&changed, SHARDS);
    a.handle
        .send(RegistryEvent::Upsert(mk_service("svc-07", 3)));
    let r = streams[home].recv().await;
    assert_eq!(
        decode_xds(&r)["fake/svc-07"].spec.endpoints.len(),
        3,
        "{r:?}"
    );
    streams[home].send(xds_ack(&r));
    for (i, s) in streams.iter_mut().enumerate() {
        s.silent(&format!("shard {i} holds nothing that changed"))
            .await;
    }

    // Metrics per shard, and the process-wide ones still add up.
    let m = a.metrics().await;
    let mut per_shard = BTreeMap::new();
    for i in 0..SHARDS {
        let resources = metric(
            &m,
            &format!(r#"mcp_adapter_shard_resources{{shard="{i}",registry="fake"}}"#),
        )
        .expect("shard resources");
        per_shard.insert(i, resources);
        assert!(
            metric(
                &m,
                &format!(r#"mcp_adapter_shard_connected_sinks{{shard="{i}",registry="fake"}}"#)
            )
            .is_some_and(|n| n >= 1.0),
            "{m}"
        );
        let snapshots = metric(
            &m,
            &format!(r#"mcp_adapter_shard_snapshots_total{{shard="{i}",registry="fake"}}"#),
        );
        assert_eq!(
            snapshots,
            Some(if i == home { 2.0 } else { 1.0 }),
            "shard {i}"
        );
    }
    assert_eq!(per_shard.values().sum::<f64>(), 30.0);
    assert_eq!(
        metric(&m, r#"mcp_adapter_resources{registry="fake"}"#),
        Some(30.0)
    );

    // A later change on each shard is that shard's next response: one pushed after its quiet
    // window above would come first.
    for (i, s) in streams.iter_mut().enumerate() {
        let name = (0..30)
            .map(|n| format!("svc-{n:02}"))
            .find(|n| shard_of(&ServiceKey::new(n), SHARDS) == i)
            .expect("a service on every shard");
        a.handle.send(RegistryEvent::Upsert(mk_service(&name, 4)));
        let r = s.recv().await;
        assert_eq!(
            decode_xds(&r)[&format!("fake/{name}")].spec.endpoints.len(),
            4,
            "shard {i}: {r:?}"
        );
    }
    a.stop().await;
}

/// `--state-file` with `--shards`: each shard keeps its own file and a restart during a
/// registry outage serves each shard's set with its version; another shard count restores
/// nothing (its services would be on the wrong ports) and waits for the registry.
#[tokio::test]
async fn each_shard_restores_its_own_saved_set() {
    let dir = std::env::temp_dir().join(format!("mcp-shards-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("state dir");
    let path = dir.join("last-served.pb");
    let mut args = test_args();
    args.shards = SHARDS as u16;
    args.state_file = Some(path.clone());

    let first = Adapter::start_with(args.clone()).await;
    first.handle.send(RegistryEvent::Reset(services()));
    wait_shards_published(&first).await;
    let mut before = Vec::new();
    for addr in first.running.grpc_addrs.clone() {
        let (_, served, version) = served_at(&first, addr).await;
        before.push((served, version));
    }
    first.stop().await;
    for i in 0..SHARDS {
        let file = dir.join(format!("last-served.pb.shard-{i}-of-{SHARDS}"));
        assert!(file.exists(), "{} written", file.display());
    }

    // The registry is down: the new process's watch never delivers anything.
    let second = Adapter::start_with(args.clone()).await;
    let body = second.wait_readyz(200).await;
    assert!(body.contains("restored"), "{body}");
    for (i, addr) in second.running.grpc_addrs.clone().into_iter().enumerate() {
        let (_, served, version) = served_at(&second, addr).await;
        assert_eq!((served, version), before[i], "shard {i} restored as served");
    }
    second.stop().await;

    let mut other = args;
    other.shards = 2;
    let third = Adapter::start_with(other).await;
    third.wait_readyz(503).await;
    third.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn shard_ports_past_65535_are_refused_before_binding() {
    let mut args = test_args();
    args.listen = "127.0.0.1:65534".parse().expect("addr");
    args.shards = 3;
    let (registry, _handle) = mcp_core::testing::fake_registry();
    let err = mcp_runtime::runtime::start(registry, args)
        .await
        .expect_err("ports past 65535");
    assert!(
        matches!(
            err,
            mcp_runtime::runtime::RunError::ShardPorts { shards: 3, .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("65535"), "{err}");
}

/// The binaries' default ports are 15051 (gRPC) and 15052 (admin): `--shards 4` alone would put
/// shard 1 on the admin port. The error says which flag to move and where.
#[tokio::test]
async fn an_admin_port_among_the_shard_ports_is_refused_with_a_way_out() {
    let mut args = test_args();
    args.listen = "127.0.0.1:15051".parse().expect("addr");
    args.admin_listen = "127.0.0.1:15052".parse().expect("addr");
    args.shards = 4;
    let (registry, _handle) = mcp_core::testing::fake_registry();
    let err = mcp_runtime::runtime::start(registry, args)
        .await
        .expect_err("admin port among the shard ports");
    let msg = err.to_string();
    assert!(
        msg.contains("--admin-listen 127.0.0.1:15052") && msg.contains("port 15050"),
        "{msg}"
    );
}
