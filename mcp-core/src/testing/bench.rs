//! Bench support shared by the core benches (`mcp-runtime/benches`) and the end-to-end scale
//! bench (`tests/benches/scale`): what a process costs, read from `/proc` (memory, CPU time),
//! and the machine a bench ran on. Linux only; a value that cannot be read is 0 (or `None`), never a panic.

use std::fmt;
use std::process::Command;

/// `MCP_BENCH_SMOKE=1` (set by the README's test command, `scripts/test.sh`): every bench runs
/// one short iteration at a tiny size, so that none rots between real runs. Its figures mean
/// nothing and nothing about them is asserted; a bench that panics fails the test command.
pub fn smoke() -> bool {
    std::env::var_os("MCP_BENCH_SMOKE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The number in the environment variable `name`, else `default`; a value that is not a
/// number stops the bench with its name (a typo must not silently run the default size).
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// `full` normally, `tiny` in a smoke run ([`smoke`]).
pub fn scaled(full: usize, tiny: usize) -> usize {
    if smoke() {
        tiny
    } else {
        full
    }
}

/// A process whose `/proc` entries are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proc {
    /// The calling process (`/proc/self`).
    This,
    /// Another process.
    Pid(u32),
}

/// Resident memory of a process, from `/proc/<pid>/status` (0 where a field is missing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mem {
    /// `VmRSS`: resident set size now, KiB.
    pub rss_kib: u64,
    /// `VmHWM`: the peak resident set size, KiB.
    pub hwm_kib: u64,
}

impl Mem {
    /// VmRSS in MiB.
    pub fn rss_mib(self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    /// VmHWM in MiB.
    pub fn hwm_mib(self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }
}

/// `VmRSS 17.8 MiB, VmHWM 17.9 MiB`.
impl fmt::Display for Mem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VmRSS {:.1} MiB, VmHWM {:.1} MiB",
            self.rss_mib(),
            self.hwm_mib()
        )
    }
}

impl Proc {
    /// `/proc/<pid>/<file>` as text ("" when it cannot be read, e.g. the process is gone).
    fn read(self, file: &str) -> String {
        let path = match self {
            Proc::This => format!("/proc/self/{file}"),
            Proc::Pid(pid) => format!("/proc/{pid}/{file}"),
        };
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// VmRSS and VmHWM.
    pub fn mem(self) -> Mem {
        let status = self.read("status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Mem {
            rss_kib: field("VmRSS:"),
            hwm_kib: field("VmHWM:"),
        }
    }

    /// CPU time used so far, user + system, in clock ticks (`/proc/<pid>/stat` fields 14 and 15;
    /// see [`clock_ticks`]).
    pub fn cpu_ticks(self) -> u64 {
        let stat = self.read("stat");
        // The command name may contain spaces; fields are counted after its closing paren.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): utime is field 14, stime field 15.
        let get = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok());
        get(14).unwrap_or(0) + get(15).unwrap_or(0)
    }
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 if that fails).
pub fn clock_ticks() -> f64 {
    command_line("getconf", &["CLK_TCK"])
        .parse()
        .unwrap_or(100.0)
}

/// The trimmed stdout of a command that succeeded, else `unknown`.
pub fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU's model name, from `/proc/cpuinfo`.
pub fn cpu_model() -> Option<String> {
    std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| {
        c.lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
    })
}

/// The cores this process may use (0 if unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// `MemTotal` from `/proc/meminfo`, KiB.
pub fn mem_total_kib() -> Option<f64> {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
    })
}

/// The 1, 5 and 15 minute load averages from `/proc/loadavg` (`0.52 0.58 0.59`; "" if unknown).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let mem = Proc::This.mem();
        assert!(mem.rss_kib > 0 && mem.hwm_kib >= mem.rss_kib, "{mem:?}");
        assert!(Proc::Pid(std::process::id()).mem().hwm_kib > 0);
        // Burn a little CPU so at least one tick is counted.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(Proc::This.cpu_ticks() > 0);
        assert!(clock_ticks() > 0.0);
    }

    #[test]
    fn mem_displays_in_mib() {
        let mem = Mem {
            rss_kib: 18227,
            hwm_kib: 18330,
        };
        assert_eq!(mem.to_string(), "VmRSS 17.8 MiB, VmHWM 17.9 MiB");
    }
}
