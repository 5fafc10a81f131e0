//! The delta phase: one changed service at a time -> a delta sink, timed from the moment the
//! adapter opens the changed file (inotify) and split by the adapter's log into read+parse, the
//! core, and the push.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::fs::inotify;

use crate::adapter::{times, AdapterProc, PUBLISHED, SENT_CHANGES, SENT_FULL_SET};
use crate::inventory::{service_name, Inventory};
use crate::sinks::{Line, Mode, SinkProc};
use crate::util::{ms_between, now_ns};
use mcp_core::testing::Rng;

const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// adapter-file re-reads a file modified less than 2 s before its last read; a file is edited
/// again only after this long, so every open after an edit is the one that sees it.
const REREAD_GUARD: Duration = Duration::from_millis(3500);
/// The adapter's default `--poll-interval` (pauses between changes are spread over it).
const POLL: Duration = Duration::from_secs(1);

/// One change, timed (ns since the epoch).
pub struct Change {
    pub k: usize,
    pub file: usize,
    written: u64,
    pub opened: Option<u64>,
    received: u64,
    reset: Option<u64>,
    published: Option<u64>,
}

/// What a stage of a change took, in ms (`None` where the log or inotify missed a step).
pub type StageMs = fn(&Change) -> Option<f64>;

/// The stages of a change as `delta.csv` (column) and the table (label) report them, in order.
pub const STAGES: [(&str, &str, StageMs); 5] = [
    (
        "write_to_sink_ms",
        "  file written -> sink (incl. poll wait)  ",
        Change::write_to_sink_ms,
    ),
    (
        "open_to_sink_ms",
        "  file opened -> sink                     ",
        Change::open_to_sink_ms,
    ),
    (
        "open_to_reset_ms",
        "    opened -> Reset sent (read, parse)    ",
        Change::open_to_reset_ms,
    ),
    (
        "reset_to_published_ms",
        "    Reset -> published (core, +coalesce)  ",
        Change::reset_to_published_ms,
    ),
    (
        "published_to_sink_ms",
        "    published -> sink (push)              ",
        Change::published_to_sink_ms,
    ),
];

impl Change {
    /// File written -> sink, including the wait for the adapter's poll.
    pub fn write_to_sink_ms(&self) -> Option<f64> {
        Some(ms_between(self.written, self.received))
    }

    pub fn open_to_sink_ms(&self) -> Option<f64> {
        self.opened.map(|o| ms_between(o, self.received))
    }

    fn open_to_reset_ms(&self) -> Option<f64> {
        self.opened.zip(self.reset).map(|(o, r)| ms_between(o, r))
    }

    fn reset_to_published_ms(&self) -> Option<f64> {
        self.reset
            .zip(self.published)
            .map(|(r, p)| ms_between(r, p))
    }

    pub fn published_to_sink_ms(&self) -> Option<f64> {
        self.published.map(|p| ms_between(p, self.received))
    }
}

/// Watches `dir` for opens; (file name, ns since the epoch) as the event is read.
fn watch_opens(dir: &Path) -> mpsc::Receiver<(String, u64)> {
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).expect("inotify_init");
    inotify::add_watch(&fd, dir, inotify::WatchFlags::OPEN).expect("inotify_add_watch");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = inotify::Reader::new(&fd, &mut buf);
        loop {
            match reader.next() {
                Ok(event) => {
                    let t = now_ns();
                    if let Some(name) = event.file_name() {
                        if tx.send((name.to_string_lossy().into_owned(), t)).is_err() {
                            return;
                        }
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
        }
    });
    rx
}

/// One changed service at a time -> the delta sink. Returns the changes and the files edited.
pub fn delta_phase(
    a: &AdapterProc,
    inv: &Inventory,
    changes: usize,
) -> (Vec<Change>, BTreeSet<usize>) {
    let opens = watch_opens(&inv.dir);
    let sink = SinkProc::spawn(a.grpc, 1, Mode::Delta);
    sink.wait_full(1, inv.services);
    let files = inv.files();
    let mut last_edit: BTreeMap<usize, Instant> = BTreeMap::new();
    let mut rng = Rng(now_ns() | 1);
    let mut out = Vec::new();
    let run = now_ns() % 100_000;
    for k in 0..changes {
        let file = k % files;
        if let Some(t) = last_edit.get(&file) {
            std::thread::sleep(REREAD_GUARD.saturating_sub(t.elapsed()));
        }
        let want = format!("/{}", service_name(file * inv.per_file));
        let text = inv.chunk(file, Some(&format!("r{run}-{k}")));
        while opens.try_recv().is_ok() {}
        let written = now_ns();
        inv.replace(file, &text);
        last_edit.insert(file, Instant::now());
        let deadline = Instant::now() + CHANGE_TIMEOUT;
        let received = loop {
            if let Line::Delta { t, names, .. } = sink.next(deadline, "the changed service") {
                if names.iter().any(|n| n.ends_with(&want)) {
                    break t;
                }
            }
        };
        // The adapter's first open of the file after the write (it precedes the push; give
        // the watcher thread a moment in case it was descheduled).
        let name = inv.file_name(file);
        let open_deadline = Instant::now() + Duration::from_secs(1);
        let mut opened = None;
        while opened.is_none() {
            match opens.recv_timeout(open_deadline.saturating_duration_since(Instant::now())) {
                Ok((n, t)) if n == name && t >= written => opened = Some(t),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        out.push(Change {
            k,
            file,
            written,
            opened,
            received,
            reset: None,
            published: None,
        });
        // Land the next write at a random phase of the poll interval.
        std::thread::sleep(Duration::from_millis(rng.below(POLL.as_millis() as u64)));
    }
    sink.close();
    // The adapter's log splits each change: changes (or a Reset) sent, snapshot published.
    let events = a.events();
    let resets = times(&events, &[SENT_FULL_SET, SENT_CHANGES]);
    let publishes = times(&events, &[PUBLISHED]);
    for c in &mut out {
        let from = c.opened.unwrap_or(c.written);
        c.reset = resets
            .iter()
            .copied()
            .find(|&t| t >= from && t <= c.received);
        c.published = publishes
            .iter()
            .copied()
            .find(|&t| t >= c.reset.unwrap_or(from) && t <= c.received);
    }
    (out, last_edit.into_keys().collect())
}
