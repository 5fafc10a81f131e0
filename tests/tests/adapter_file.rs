//! adapter-file as a user runs it: the real binary, watched with the real `mcpctl`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::{
    item_names as names, mcpctl_get as get, service_entry_yaml as se, wait_for, workspace_bin,
    Adapter,
};

/// Writes `docs` as one multi-document YAML file.
fn write_docs(path: &Path, docs: &[String]) {
    std::fs::write(path, docs.join("---\n"))
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn start(dir: &Path) -> Adapter {
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
    let xds = adapter.xds_url();
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
    write_docs(
        &dir.path().join("two.yaml"),
        &[se("first", "10.0.0.2"), se("second", "10.0.0.3")],
    );
    let adapter = start(dir.path());
    let xds = adapter.xds_url();
    assert_eq!(names(&get(&xds)), vec!["ns/first", "ns/good", "ns/second"]);

    // A shape error in document 2: the file keeps its last good content, the error names file,
    // document and field.
    write_docs(
        &dir.path().join("two.yaml"),
        &[
            se("first", "10.0.0.2"),
            se("second", "10.0.0.3").replace("number: 80", "number: eighty"),
        ],
    );
    let problems = adapter.wait_problems(Duration::from_secs(10), "problem reported", |p| {
        p.contains("two.yaml")
    });
    assert!(problems.contains("document 2"), "{problems}");
    assert!(problems.contains("spec.ports[0].number"), "{problems}");
    // An unknown kind elsewhere is reported too; the good file is untouched.
    std::fs::write(
        dir.path().join("odd.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .expect("write");
    let problems = adapter.wait_problems(Duration::from_secs(10), "unknown kind reported", |p| {
        p.contains("odd.yaml")
    });
    assert!(problems.contains("ConfigMap"), "{problems}");
    assert_eq!(names(&get(&xds)), vec!["ns/first", "ns/good", "ns/second"]);
    assert!(adapter
        .get("/metrics")
        .1
        .contains("mcp_adapter_registry_problems{registry=\"file\"} 2"));

    // A ServiceEntry Istio would reject: quarantined on its own, named by file, document, field.
    write_docs(
        &dir.path().join("good.yaml"),
        &[
            se("good", "10.0.0.1"),
            se("invalid", "10.0.0.4").replace("name: http", "name: HTTP_1"),
        ],
    );
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
    write_docs(
        &dir.path().join("two.yaml"),
        &[se("first", "10.0.0.2"), se("second", "10.0.0.9")],
    );
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

    // A wide alias bomb (20 KB expanding to five million values) is refused by name, quickly,
    // and the rest stays served.
    let items = vec!["x"; 1000].join(",");
    let refs = vec!["*a"; 5000].join(",");
    std::fs::write(
        dir.path().join("bomb.yaml"),
        format!("a: &a [{items}]\nb: [{refs}]\n"),
    )
    .expect("write");
    let problems = adapter.wait_problems(Duration::from_secs(10), "alias bomb reported", |p| {
        p.contains("bomb.yaml")
    });
    assert!(problems.contains("aliases expand"), "{problems}");
    assert_eq!(names(&get(&xds)), vec!["ns/first", "ns/good", "ns/second"]);
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
    let a = get(&one.xds_url());
    let b = get(&two.xds_url());
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
    assert_eq!(get(&three.xds_url()), b);
}

#[test]
fn sigterm_shuts_down_gracefully_with_a_sink_connected() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    let mut adapter = start(dir.path());
    // A sink stays connected (mcpctl --watch) while the adapter is told to stop.
    let (out, err) = (dir.path().join("sink.out"), dir.path().join("sink.err"));
    let file = |p: &Path| std::fs::File::create(p).expect("sink output file");
    let mut watch = Command::new(workspace_bin("mcpctl"))
        .args([
            "get",
            "se",
            "--server",
            &adapter.xds_url(),
            "--watch",
            "-o",
            "json",
        ])
        .stdout(file(&out))
        .stderr(file(&err))
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
    // The sink got the set, then learned that the stream ended (it does not hang on a
    // connection nobody serves) and exited with the reason.
    let exited = wait_for(Duration::from_secs(10), "the sink to exit", || {
        watch.try_wait().expect("mcpctl status")
    });
    let (seen, said) = (
        std::fs::read_to_string(&out).expect("sink output"),
        std::fs::read_to_string(&err).expect("sink errors"),
    );
    let sets: Vec<serde_json::Value> = seen
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line per set"))
        .collect();
    assert_eq!(sets.len(), 1, "one set, then the end: {seen}");
    let items = sets[0]["items"].as_array().expect("items");
    assert_eq!(names(items), ["ns/a"], "{seen}");
    assert!(
        !exited.success(),
        "the end of the stream is an error to a watch"
    );
    assert!(said.contains("closed the stream"), "mcpctl said: {said}");
}

/// Starts the adapter on several paths with the same flags as [`start`].
fn start_paths(paths: &[&Path]) -> Adapter {
    let mut args = Vec::new();
    for p in paths {
        args.push("--path".to_owned());
        args.push(p.to_string_lossy().to_string());
    }
    args.extend(["--poll-interval".to_owned(), "50ms".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Adapter::start("adapter-file", &args);
    a.wait_ready();
    a
}

/// Names of the resources /debug/resources says are served (`ns/name`).
fn served(adapter: &Adapter) -> Vec<String> {
    adapter.debug()["resources"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|e| e["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Edits `a.yaml` to a new endpoint and waits (bounded) until a sink sees it.
fn assert_edit_served(adapter: &Adapter, dir: &Path, ip: &str) {
    let xds = adapter.xds_url();
    std::fs::write(dir.join("a.yaml"), se("a", ip)).expect("edit");
    wait_for(Duration::from_secs(10), "edit of a.yaml served", || {
        let items = get(&xds);
        let a = e2e::find(&items, "a")?;
        (a["spec"]["endpoints"][0]["address"] == ip).then_some(())
    });
}

#[test]
fn a_named_pipe_in_a_watched_directory_does_not_block_reloads() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    let adapter = start(dir.path());
    let pipe = dir.path().join("pipe.yaml");
    let status = Command::new("mkfifo").arg(&pipe).status().expect("mkfifo");
    assert!(status.success());

    // The pipe is named as a problem and counted; the other file's edits keep being served.
    let p = adapter.wait_problems(Duration::from_secs(10), "pipe reported", |p| {
        p.contains("pipe.yaml")
    });
    assert!(p.contains("not a regular file: named pipe"), "{p}");
    assert!(adapter
        .get("/metrics")
        .1
        .contains("mcp_adapter_registry_problems{registry=\"file\"} 1"));
    assert_edit_served(&adapter, dir.path(), "10.0.0.2");
    assert_edit_served(&adapter, dir.path(), "10.0.0.3");

    // Removing the pipe clears the problem; reloads go on.
    std::fs::remove_file(&pipe).expect("rm pipe");
    adapter.wait_problems(Duration::from_secs(10), "pipe problem cleared", |p| {
        !p.contains("pipe.yaml")
    });
    assert_edit_served(&adapter, dir.path(), "10.0.0.4");
}

#[test]
fn a_symlink_to_a_device_is_refused_and_reloads_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    let adapter = start(dir.path());
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).expect("symlink");

    let p = adapter.wait_problems(Duration::from_secs(10), "device reported", |p| {
        p.contains("zero.yaml")
    });
    assert!(p.contains("not a regular file: character device"), "{p}");
    assert_edit_served(&adapter, dir.path(), "10.0.0.2");
    assert_eq!(served(&adapter), vec!["ns/a"]);
}

#[test]
fn paths_that_cannot_be_listed_or_stated_keep_their_last_good_content() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("conf");
    // `conf/sub` is a symlink to a directory so that it can be swapped atomically below.
    let sub_dir = dir.path().join("sub-dir");
    std::fs::create_dir_all(&sub_dir).expect("mkdir");
    std::fs::create_dir_all(&conf).expect("mkdir");
    std::os::unix::fs::symlink(&sub_dir, conf.join("sub")).expect("symlink");
    std::fs::write(conf.join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    std::fs::write(sub_dir.join("s.yaml"), se("s", "10.0.0.2")).expect("write");
    // `other` is a symlink to a directory, so that it can be swapped atomically below (a
    // remove-then-write would let a poll see the file really gone, which is a deletion).
    let other_dir = dir.path().join("other-dir");
    std::fs::create_dir_all(&other_dir).expect("mkdir");
    std::fs::write(other_dir.join("f.yaml"), se("f", "10.0.0.3")).expect("write");
    let other = dir.path().join("other");
    std::os::unix::fs::symlink(&other_dir, &other).expect("symlink");
    let adapter = start_paths(&[&conf, &other.join("f.yaml")]);
    let xds = adapter.xds_url();
    assert_eq!(names(&get(&xds)), vec!["ns/a", "ns/f", "ns/s"]);

    // A subdirectory replaced by a dangling symlink (a half-done swap), and a configured file
    // whose parent directory became a regular file: both cannot be stat'ed, neither is a deletion.
    let swap = dir.path().join("sub.swap");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &swap).expect("symlink");
    std::fs::rename(&swap, conf.join("sub")).expect("atomic swap: conf/sub now dangles");
    let plain = dir.path().join("plain-file");
    std::fs::write(&plain, "a file now").expect("write");
    let swap = dir.path().join("other.swap");
    std::os::unix::fs::symlink(&plain, &swap).expect("symlink");
    std::fs::rename(&swap, &other).expect("atomic swap: other now leads to a regular file");

    let p = adapter.wait_problems(Duration::from_secs(10), "both reported", |p| {
        p.contains("conf/sub: cannot stat") && p.contains("f.yaml: cannot stat")
    });
    assert!(p.contains("dangling symlink"), "{p}");
    assert!(p.contains("No such file or directory"), "{p}");
    assert!(p.contains("Not a directory"), "{p}");
    // Other files keep reloading, and the unreadable ones keep their services meanwhile.
    assert_edit_served(&adapter, &conf, "10.0.0.9");
    assert_eq!(names(&get(&xds)), vec!["ns/a", "ns/f", "ns/s"]);

    // Repaired: problems clear and the content is read again.
    std::fs::write(sub_dir.join("s.yaml"), se("s", "10.0.0.7")).expect("edit");
    let swap = dir.path().join("sub.swap");
    std::os::unix::fs::symlink(&sub_dir, &swap).expect("symlink");
    std::fs::rename(&swap, conf.join("sub")).expect("atomic swap back");
    std::fs::remove_file(&other).expect("rm file");
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("f.yaml"), se("f2", "10.0.0.8")).expect("write");
    wait_for(Duration::from_secs(10), "repaired", || {
        let items = get(&xds);
        let s = e2e::find(&items, "s")?;
        (names(&items) == vec!["ns/a", "ns/f2", "ns/s"]
            && s["spec"]["endpoints"][0]["address"] == "10.0.0.7")
            .then_some(())
    });
    adapter.wait_problems(Duration::from_secs(10), "problems cleared", |p| p == "{}");
}

#[test]
fn an_emptied_file_is_applied_only_once_it_stays_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    std::fs::write(dir.path().join("b.yaml"), se("b", "10.0.0.2")).expect("write");
    let adapter = start(dir.path());
    assert_eq!(served(&adapter), vec!["ns/a", "ns/b"]);

    // An editor or `kubectl cp` truncates a.yaml before writing it. A new file written after the
    // truncation shows when a poll has seen it: a must still be served then.
    std::fs::write(dir.path().join("a.yaml"), "").expect("truncate");
    std::fs::write(dir.path().join("c.yaml"), se("c", "10.0.0.3")).expect("write");
    let seen = wait_for(Duration::from_secs(10), "c.yaml served", || {
        let s = served(&adapter);
        s.contains(&"ns/c".to_owned()).then_some(s)
    });
    assert_eq!(seen, vec!["ns/a", "ns/b", "ns/c"]);

    // The write completes: a never disappeared, and its new content is served.
    assert_edit_served(&adapter, dir.path(), "10.0.0.5");

    // An empty file that stays empty is meant: applied after the settle time.
    std::fs::write(dir.path().join("a.yaml"), "").expect("empty");
    wait_for(Duration::from_secs(10), "emptied a.yaml applied", || {
        (served(&adapter) == vec!["ns/b", "ns/c"]).then_some(())
    });
    // Deleting a file is applied too.
    std::fs::remove_file(dir.path().join("b.yaml")).expect("rm");
    wait_for(Duration::from_secs(10), "deletion applied", || {
        (served(&adapter) == vec!["ns/c"]).then_some(())
    });
    let xds = adapter.xds_url();
    assert_eq!(names(&get(&xds)), vec!["ns/c"]);
}

/// Sharding is a flag: adapters over the same files with `--shard 0/3`, `1/3` and `2/3` serve
/// disjoint sets whose union is everything, each replica of a shard serves the same set, and a
/// glob shard (`--shard-services`) serves exactly its names.
#[test]
fn shards_partition_one_registry_over_several_adapters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let all: Vec<String> = (0..30).map(|i| format!("ns/svc-{i:02}")).collect();
    for i in 0..30 {
        let name = format!("svc-{i:02}");
        std::fs::write(
            dir.path().join(format!("{name}.yaml")),
            se(&name, &format!("10.0.0.{}", i + 1)),
        )
        .expect("write");
    }
    let path = dir.path().to_string_lossy().to_string();
    let shard = |flags: &[&str]| {
        let mut args = vec!["--path", path.as_str()];
        args.extend_from_slice(flags);
        let a = Adapter::start("adapter-file", &args);
        a.wait_ready();
        let served = names(&get(&a.xds_url()));
        (a, served)
    };
    let mut union = Vec::new();
    let mut shards = Vec::new();
    for i in 0..3 {
        let (a, served) = shard(&["--shard", &format!("{i}/3")]);
        assert!(
            (4..=16).contains(&served.len()),
            "shard {i}/3 holds a share: {served:?}"
        );
        let (replica, again) = shard(&["--shard", &format!("{i}/3")]);
        assert_eq!(
            again, served,
            "every replica of a shard serves the same set"
        );
        let replica_snapshots = replica.metric("mcp_adapter_snapshots_total");
        replica.assert_steady(Duration::from_millis(300));
        union.extend(served.iter().cloned());
        shards.push((a, replica, served, replica_snapshots));
    }
    union.sort();
    assert_eq!(
        union, all,
        "the shards are disjoint and cover every service"
    );
    let snapshots: Vec<f64> = shards
        .iter()
        .map(|(a, ..)| a.metric("mcp_adapter_snapshots_total"))
        .collect();
    for (a, ..) in &shards {
        a.assert_steady(Duration::from_millis(300));
    }
    // After the quiet windows above, one edit of a service of each shard in turn: both
    // replicas of its shard serve it, with the same names, and every adapter (replicas kept
    // running for this) has built exactly one snapshot since its window, for its own shard's
    // edit. A snapshot built late, after a window, is counted here too.
    for (i, (a, replica, served, _)) in shards.iter().enumerate() {
        let name = served[0].strip_prefix("ns/").expect("ns/ name");
        let ip = format!("10.0.2.{i}");
        std::fs::write(dir.path().join(format!("{name}.yaml")), se(name, &ip)).expect("edit");
        for (who, adapter) in [("shard", a), ("replica", replica)] {
            wait_for(
                Duration::from_secs(10),
                &format!("{who} {i}/3 serves {name} at {ip}"),
                || {
                    let items = get(&adapter.xds_url());
                    let s = e2e::find(&items, name)?;
                    (names(&items) == *served && s["spec"]["endpoints"][0]["address"] == ip)
                        .then_some(())
                },
            );
        }
    }
    for (i, ((a, replica, _, replica_snapshots), snapshots)) in
        shards.iter().zip(&snapshots).enumerate()
    {
        for (who, adapter, before) in [
            ("shard", a, snapshots),
            ("replica", replica, replica_snapshots),
        ] {
            assert_eq!(
                adapter.metric("mcp_adapter_snapshots_total"),
                before + 1.0,
                "{who} {i}/3: one snapshot, for its own edit; log:\n{}",
                adapter.log_tail()
            );
        }
    }

    let (a, served) = shard(&[
        "--shard-services",
        "ns/svc-1*",
        "--shard-exclude-services",
        "ns/svc-19",
    ]);
    let want: Vec<String> = (10..19).map(|i| format!("ns/svc-{i}")).collect();
    assert_eq!(served, want);
    let snapshots = a.metric("mcp_adapter_snapshots_total");
    a.assert_steady(Duration::from_millis(300));
    // A later service the filter takes is the one new snapshot: one built after the steady
    // window above would be counted too.
    std::fs::write(dir.path().join("svc-1z.yaml"), se("svc-1z", "10.0.1.99")).expect("write");
    let mut want = want;
    want.push("ns/svc-1z".into());
    wait_for(Duration::from_secs(10), "svc-1z served", || {
        (names(&get(&a.xds_url())) == want).then_some(())
    });
    assert_eq!(a.metric("mcp_adapter_snapshots_total"), snapshots + 1.0);
}

/// Each item's name and resourceVersion.
fn versions(items: &[serde_json::Value]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|i| {
            (
                i["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                i["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

#[test]
fn editing_one_file_of_many_changes_only_its_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    for f in 0..20 {
        let docs: Vec<String> = (0..5)
            .map(|s| se(&format!("s{f:02}x{s}"), &format!("10.0.{f}.{s}")))
            .collect();
        std::fs::write(dir.path().join(format!("f{f:02}.yaml")), docs.join("---\n"))
            .expect("write");
    }
    let adapter = start(dir.path());
    let xds = adapter.xds_url();
    let before = versions(&get(&xds));
    assert_eq!(before.len(), 100);
    let snapshots = adapter.metric("mcp_adapter_snapshots_total");

    // One service of one file changes: one new snapshot, one new resource version.
    let docs: Vec<String> = (0..5)
        .map(|s| {
            let ip = if s == 2 {
                "10.9.9.9".to_owned()
            } else {
                format!("10.0.7.{s}")
            };
            se(&format!("s07x{s}"), &ip)
        })
        .collect();
    std::fs::write(dir.path().join("f07.yaml"), docs.join("---\n")).expect("edit");
    let after = wait_for(Duration::from_secs(10), "edit served", || {
        let after = versions(&get(&xds));
        (after != before).then_some(after)
    });
    let changed: Vec<&str> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b != a)
        .map(|(b, _)| b.0.as_str())
        .collect();
    assert_eq!(changed, vec!["s07x2"]);
    adapter.assert_steady(Duration::from_millis(500));
    assert_eq!(
        adapter.metric("mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "log:\n{}",
        adapter.log_tail()
    );

    // A later edit of another file is the next change, alone: a snapshot or version change
    // that came after the steady window would show here.
    let docs: Vec<String> = (0..5)
        .map(|s| {
            let ip = if s == 4 {
                "10.9.9.8".to_owned()
            } else {
                format!("10.0.13.{s}")
            };
            se(&format!("s13x{s}"), &ip)
        })
        .collect();
    std::fs::write(dir.path().join("f13.yaml"), docs.join("---\n")).expect("edit");
    let last = wait_for(Duration::from_secs(10), "second edit served", || {
        let last = versions(&get(&xds));
        (last != after).then_some(last)
    });
    let changed: Vec<&str> = after
        .iter()
        .zip(&last)
        .filter(|(b, a)| b != a)
        .map(|(b, _)| b.0.as_str())
        .collect();
    assert_eq!(changed, vec!["s13x4"]);
    assert_eq!(
        adapter.metric("mcp_adapter_snapshots_total"),
        snapshots + 2.0,
        "log:\n{}",
        adapter.log_tail()
    );
}

/// Services `range` of a generated inventory (ten endpoints each, with labels and a locality),
/// as YAML in block style, the way exporters and people write it.
fn inventory_yaml(range: std::ops::Range<usize>) -> String {
    let mut out = String::from("kind: Inventory\nnamespace: big\nservices:\n");
    for i in range {
        out.push_str(&format!(
            "  - name: svc-{i:05}\n    ports: {{http: 8080}}\n    endpoints:\n"
        ));
        for j in 0..10 {
            let e = i * 10 + j;
            out.push_str(&format!(
                "      - {{address: 10.{}.{}.{}, locality: eu/zone-{}, labels: {{version: v{}, track: stable}}}}\n",
                (e >> 16) & 255,
                (e >> 8) & 255,
                e & 255,
                j % 3,
                j % 2
            ));
        }
    }
    out
}

/// The same services as one JSON document, `namespace` last (keys as a sorting exporter
/// writes them would put it before `services`; this is the harder order).
fn inventory_json(range: std::ops::Range<usize>) -> String {
    let services: Vec<String> = range
        .map(|i| {
            let endpoints: Vec<String> = (0..10)
                .map(|j| {
                    let e = i * 10 + j;
                    format!(
                        r#"{{"address": "10.{}.{}.{}", "locality": "eu/zone-{}", "labels": {{"version": "v{}", "track": "stable"}}}}"#,
                        (e >> 16) & 255,
                        (e >> 8) & 255,
                        e & 255,
                        j % 3,
                        j % 2
                    )
                })
                .collect();
            format!(
                r#"{{"name": "svc-{i:05}", "ports": {{"http": 8080}}, "endpoints": [{}]}}"#,
                endpoints.join(", ")
            )
        })
        .collect();
    format!(
        "{{\"kind\": \"Inventory\", \"services\": [\n{}\n], \"namespace\": \"big\"}}",
        services.join(",\n")
    )
}

/// Starts the adapter on `dir`, waits (generously: a debug build parsing thousands of services
/// on a loaded machine) until it serves `services`, checks the steady state, and returns its
/// peak resident memory in KiB.
fn peak_serving(dir: &Path, services: usize) -> u64 {
    let path = dir.to_string_lossy().to_string();
    let adapter = Adapter::start("adapter-file", &["--path", &path]);
    adapter.wait_admin(
        Duration::from_secs(300),
        "adapter /readyz",
        "/readyz",
        |s, _| s == 200,
    );
    wait_for(Duration::from_secs(300), "every service served", || {
        (adapter.debug()["total"].as_u64() == Some(services as u64)).then_some(())
    });
    let names = served(&adapter);
    assert_eq!(names.first().map(String::as_str), Some("big/svc-00000"));
    let snapshots = adapter.metric("mcp_adapter_snapshots_total");
    adapter.assert_steady(Duration::from_secs(2));
    let pid = adapter.pid().expect("adapter running");
    let peak = mcp_core::testing::bench::Proc::Pid(pid).mem().hwm_kib;
    // After the measurement, so that it is the same: one more service in a file of its own is
    // the one snapshot since the quiet window (a rebuild after it, e.g. the big file read again,
    // would be counted too).
    std::fs::write(dir.join("zz-late.yaml"), se("late", "10.9.0.1")).expect("write");
    wait_for(Duration::from_secs(120), "the later service served", || {
        (adapter.debug()["total"].as_u64() == Some(services as u64 + 1)).then_some(())
    });
    assert_eq!(
        adapter.metric("mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "the later service is the one snapshot since the window; log:\n{}",
        adapter.log_tail()
    );
    peak
}

/// #22 item 15: a CMDB export is often one file. One file of 4,000 services (YAML, and JSON
/// with `namespace` after `services`) must cost about what the same services in 40 files cost:
/// the file is converted one service at a time, never held as one tree (before, the YAML file's
/// peak was ~28 bytes per byte of text: 3.4 GiB for 100k services).
#[test]
fn one_big_file_costs_what_many_small_files_cost() {
    const SERVICES: usize = 4_000;
    const PER_FILE: usize = 100;
    let many = tempfile::tempdir().expect("tempdir");
    for f in 0..SERVICES / PER_FILE {
        std::fs::write(
            many.path().join(format!("part-{f:03}.yaml")),
            inventory_yaml(f * PER_FILE..(f + 1) * PER_FILE),
        )
        .expect("write part");
    }
    let one_yaml = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        one_yaml.path().join("export.yaml"),
        inventory_yaml(0..SERVICES),
    )
    .expect("write export.yaml");
    let one_json = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        one_json.path().join("export.json"),
        inventory_json(0..SERVICES),
    )
    .expect("write export.json");

    let many_kib = peak_serving(many.path(), SERVICES);
    for (what, dir) in [("YAML", one_yaml.path()), ("JSON", one_json.path())] {
        let one_kib = peak_serving(dir, SERVICES);
        eprintln!("one {what} file: peak {one_kib} KiB; 40 files: {many_kib} KiB");
        assert!(
            one_kib <= many_kib * 5 / 4 + 16 * 1024,
            "one {what} file peaked at {one_kib} KiB, the same services in 40 files at {many_kib} KiB"
        );
    }
}

/// `mcp_adapter_heap_bytes` stays true across re-reads: each read runs on a thread of its own
/// that allocates the file's content, freed later on another thread. That thread's count must
/// reach the shared sum before it ends; it did not (found by the soak, `tests/tests/soak.rs`),
/// and every read of a ~10 KiB file lowered the count by as much, down to 0 after a few dozen
/// changes, hiding any leak.
#[test]
fn the_heap_count_survives_many_re_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("inventory.yaml");
    let write = |range: std::ops::Range<usize>| {
        let tmp = dir.path().join(".inventory.tmp");
        std::fs::write(&tmp, inventory_yaml(range)).expect("write");
        std::fs::rename(&tmp, &file).expect("rename");
    };
    write(0..10);
    let adapter = start(dir.path());
    let snapshots = || adapter.metric("mcp_adapter_snapshots_total");
    let before = adapter.metric("mcp_adapter_heap_bytes");
    assert!(before > 0.0, "no heap count");
    for round in 1..=30 {
        let seen = snapshots();
        write(round % 2..10 + round % 2);
        wait_for(Duration::from_secs(10), "the change read", || {
            (snapshots() > seen).then_some(())
        });
    }
    let after = adapter.metric("mcp_adapter_heap_bytes");
    // 30 reads of ~10 KiB each: without the fix the count falls by ~300 KiB, from ~400 KiB.
    assert!(
        after > before / 2.0,
        "heap count fell from {before} to {after} bytes over 30 re-reads of the same-sized file"
    );
}
