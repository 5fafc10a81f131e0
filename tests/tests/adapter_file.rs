//! adapter-file as a user runs it: the real binary, watched with the real `mcpctl`.

use std::process::Command;
use std::time::Duration;

use e2e::{item_names as names, mcpctl_get as get, wait_for, workspace_bin, Adapter};

fn se(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  hosts: [{name}.example.com]\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{{address: {ip}}}]\n"
    )
}

fn start(dir: &std::path::Path) -> Adapter {
    let path = dir.to_string_lossy().to_string();
    let a = Adapter::start(
        "adapter-file",
        &["--path", &path, "--poll-interval", "50ms"],
    );
    a.wait_ready();
    a
}

#[test]
fn reloads_edits_new_files_and_deletions_without_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    let adapter = start(dir.path());
    let xds = format!("xds://{}", adapter.grpc);
    assert_eq!(names(&get(&xds)), vec!["ns/a"]);

    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.2")).expect("edit");
    wait_for(Duration::from_secs(10), "edit served", || {
        let items = get(&xds);
        (items[0]["spec"]["endpoints"][0]["address"] == "10.0.0.2").then_some(())
    });

    std::fs::write(dir.path().join("b.yaml"), se("b", "10.0.0.3")).expect("new file");
    wait_for(Duration::from_secs(10), "new file served", || {
        (names(&get(&xds)) == vec!["ns/a", "ns/b"]).then_some(())
    });
    // The legacy MCP and delta sinks see the same set.
    assert_eq!(
        names(&get(&format!("mcp://{}", adapter.grpc))),
        vec!["ns/a", "ns/b"]
    );
    assert_eq!(
        names(&get(&format!("delta://{}", adapter.grpc))),
        vec!["ns/a", "ns/b"]
    );

    std::fs::remove_file(dir.path().join("a.yaml")).expect("delete");
    wait_for(Duration::from_secs(10), "deletion served", || {
        (names(&get(&xds)) == vec!["ns/b"]).then_some(())
    });
}

#[test]
fn bad_input_is_named_and_nothing_else_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("good.yaml"), se("good", "10.0.0.1")).expect("write");
    std::fs::write(
        dir.path().join("two.yaml"),
        format!(
            "{}---\n{}",
            se("first", "10.0.0.2"),
            se("second", "10.0.0.3")
        ),
    )
    .expect("write");
    let adapter = start(dir.path());
    let xds = format!("xds://{}", adapter.grpc);
    assert_eq!(names(&get(&xds)), vec!["ns/first", "ns/good", "ns/second"]);

    // A shape error in document 2: the file keeps its last good content, the error names file,
    // document and field.
    std::fs::write(
        dir.path().join("two.yaml"),
        format!(
            "{}---\n{}",
            se("first", "10.0.0.2"),
            se("second", "10.0.0.3").replace("number: 80", "number: eighty")
        ),
    )
    .expect("break");
    let problems = wait_for(Duration::from_secs(10), "problem reported", || {
        let p = adapter.debug()["problems"].to_string();
        p.contains("two.yaml").then_some(p)
    });
    assert!(problems.contains("document 2"), "{problems}");
    assert!(problems.contains("spec.ports[0].number"), "{problems}");
    // An unknown kind elsewhere is reported too; the good file is untouched.
    std::fs::write(
        dir.path().join("odd.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .expect("write");
    let problems = wait_for(Duration::from_secs(10), "unknown kind reported", || {
        let p = adapter.debug()["problems"].to_string();
        p.contains("odd.yaml").then_some(p)
    });
    assert!(problems.contains("ConfigMap"), "{problems}");
    assert_eq!(names(&get(&xds)), vec!["ns/first", "ns/good", "ns/second"]);
    assert!(adapter
        .get("/metrics")
        .1
        .contains("mcp_adapter_registry_problems{registry=\"file\"} 2"));

    // A ServiceEntry Istio would reject: quarantined on its own, named by file, document, field.
    std::fs::write(
        dir.path().join("good.yaml"),
        format!(
            "{}---\n{}",
            se("good", "10.0.0.1"),
            se("invalid", "10.0.0.4").replace("name: http", "name: HTTP_1")
        ),
    )
    .expect("write");
    let quarantined = wait_for(Duration::from_secs(10), "quarantine", || {
        let q = adapter.debug()["quarantined"].clone();
        q.as_array().is_some_and(|a| !a.is_empty()).then_some(q)
    });
    let text = quarantined.to_string();
    assert!(
        text.contains("good.yaml") && text.contains("document 2"),
        "{text}"
    );
    assert!(text.contains("spec.ports[0].name"), "{text}");
    assert_eq!(names(&get(&xds)), vec!["ns/first", "ns/good", "ns/second"]);
    let log = adapter.log();
    assert!(log.contains("Quarantined an invalid service"), "{log}");

    // Fixed files recover.
    std::fs::write(
        dir.path().join("two.yaml"),
        format!(
            "{}---\n{}",
            se("first", "10.0.0.2"),
            se("second", "10.0.0.9")
        ),
    )
    .expect("fix");
    std::fs::remove_file(dir.path().join("odd.yaml")).expect("rm");
    wait_for(Duration::from_secs(10), "problems cleared", || {
        adapter.debug()["problems"]
            .as_object()
            .is_some_and(|p| p.is_empty())
            .then_some(())
    });
    let items = get(&xds);
    let second = items
        .iter()
        .find(|i| i["metadata"]["name"] == "second")
        .expect("second");
    assert_eq!(second["spec"]["endpoints"][0]["address"], "10.0.0.9");
}

#[test]
fn two_replicas_serve_identical_names_versions_and_create_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("a.yaml"),
        format!(
            "{}---\n{}",
            se("a", "10.0.0.1"),
            se("b", "10.0.0.2").replace(
                "namespace: ns}",
                "namespace: ns, creationTimestamp: \"2024-01-02T03:04:05Z\"}"
            )
        ),
    )
    .expect("write");
    let one = start(dir.path());
    let two = start(dir.path());
    let a = get(&format!("xds://{}", one.grpc));
    let b = get(&format!("xds://{}", two.grpc));
    assert_eq!(a.len(), 2);
    assert_eq!(a, b, "replicas must agree on every byte a sink sees");
    let b_item = a.iter().find(|i| i["metadata"]["name"] == "b").expect("b");
    assert_eq!(
        b_item["metadata"]["creationTimestamp"],
        "2024-01-02T03:04:05Z"
    );
    // A restart serves the same versions too.
    drop(one);
    let three = start(dir.path());
    assert_eq!(get(&format!("xds://{}", three.grpc)), b);
}

#[test]
fn sigterm_shuts_down_gracefully_with_a_sink_connected() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    let mut adapter = start(dir.path());
    // A sink stays connected (mcpctl --watch) while the adapter is told to stop.
    let mut watch = Command::new(workspace_bin("mcpctl"))
        .args([
            "get",
            "se",
            "--server",
            &format!("xds://{}", adapter.grpc),
            "--watch",
            "-o",
            "json",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("mcpctl --watch");
    wait_for(Duration::from_secs(10), "sink connected", || {
        adapter
            .get("/metrics")
            .1
            .contains("mcp_adapter_connected_sinks{protocol=\"xds\",registry=\"file\"} 1")
            .then_some(())
    });
    let status = adapter
        .terminate(Duration::from_secs(10))
        .expect("exits within 10s of SIGTERM");
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        adapter.log()
    );
    assert!(adapter.log().contains("Shutting down"), "{}", adapter.log());
    let _ = watch.kill();
    let _ = watch.wait();
}
