//! What the Kubernetes output tests share: entries written for adapter-file, and the output's
//! state as the adapter reports it.

use std::path::Path;

use serde_json::Value;

use crate::Adapter;

/// Writes a ServiceEntry file for adapter-file, `ns/<name>` with one endpoint at `ip`
/// (renamed into place: the adapter never reads half a file).
pub fn write_entry(dir: &Path, name: &str, ip: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, crate::service_entry_yaml(name, ip)).expect("write");
    std::fs::rename(&tmp, dir.join(format!("{name}.yaml"))).expect("rename");
}

/// adapter-file over `dir` (polled every 100 ms) with `--output <output>` writing into
/// namespace `ns` of the cluster `kubeconfig` names, with `extra` flags.
pub fn start_file_adapter(dir: &Path, kubeconfig: &Path, output: &str, extra: &[&str]) -> Adapter {
    let (path, kubeconfig) = (dir.display().to_string(), kubeconfig.display().to_string());
    let mut args = vec![
        "--path",
        &path,
        "--poll-interval",
        "100ms",
        "--output",
        output,
        "--output-kubeconfig",
        &kubeconfig,
        "--output-namespaces",
        "ns",
    ];
    args.extend_from_slice(extra);
    Adapter::start("adapter-file", &args)
}

/// The output's part of /debug/resources.
pub fn output(a: &Adapter) -> Value {
    a.debug()["kubeOutput"].clone()
}

/// It holds the Lease and the API server holds what it serves.
pub fn leads_in_step(a: &Adapter) -> bool {
    let o = output(a);
    o["leader"] == true && o["inStep"] == true
}

/// The endpoint addresses of a ServiceEntry object.
pub fn endpoints(obj: &Value) -> Vec<String> {
    crate::endpoint_addresses(obj)
}
