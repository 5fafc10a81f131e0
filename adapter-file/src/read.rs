//! Reading one file without letting it stall the watcher.
//!
//! A configuration directory can hold things that are not configuration: a named pipe (opening
//! it blocks until a writer appears), a symlink to a device (`/dev/zero` never ends), a huge
//! file, or a file on a hung network mount. Any of them used to freeze every later reload. So:
//! only regular files are opened (checked before and again after opening, in case the path was
//! swapped in between), at most `--max-file-size` bytes are read, and the read runs on its own
//! thread that is waited for at most `--read-timeout`. A read that times out is remembered as
//! stuck and no second read of that path is started until it finishes, so a stuck mount costs
//! one thread per file, not one per poll.

use std::collections::HashMap;
use std::fs::{self, File, FileType};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use tracing::warn;

use mcp_core::parse::format_size;

/// Why a file's text could not be obtained. Shown after `file <path>: `.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A pipe, device, socket or directory where a file was expected.
    #[error("not a regular file: {0}")]
    NotRegular(&'static str),
    /// Over `--max-file-size`.
    #[error("larger than {} (--max-file-size)", format_size(*.limit))]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The read did not finish within `--read-timeout` (it may still finish later).
    #[error("read timed out after {}s (--read-timeout)", .0.as_secs_f64())]
    TimedOut(Duration),
    /// Opening or reading failed.
    #[error("cannot read: {0}")]
    Io(#[source] io::Error),
    /// No thread could be started for the read.
    #[error("cannot start a reader thread: {0}")]
    Spawn(#[source] io::Error),
    /// The reader thread ended without an answer (it panicked).
    #[error("the reader thread failed")]
    ReaderFailed,
}

/// The blocking part: opens and reads a file, refusing anything but a regular file up to `limit`
/// bytes. A plain function pointer so tests can substitute one that blocks.
pub type ReadFn = fn(&Path, u64) -> Result<String, ReadError>;

/// Reads files with a size limit and a timeout, remembering reads that are stuck.
#[derive(Debug)]
pub struct Reader {
    timeout: Duration,
    limit: u64,
    read: ReadFn,
    /// Reads that timed out and have not finished yet, by path.
    stuck: HashMap<PathBuf, Receiver<Result<String, ReadError>>>,
}

impl Reader {
    /// A reader of regular files up to `limit` bytes, waiting at most `timeout` per read.
    pub fn new(timeout: Duration, limit: u64) -> Self {
        Self::with_read_fn(timeout, limit, read_regular)
    }

    /// [`Reader::new`] with another blocking read (for tests).
    pub fn with_read_fn(timeout: Duration, limit: u64, read: ReadFn) -> Self {
        Self {
            timeout,
            limit,
            read,
            stuck: HashMap::new(),
        }
    }

    /// Whether a read of `path` timed out and has not finished (as of the last [`Reader::read`]).
    pub fn is_stuck(&self, path: &Path) -> bool {
        // Checked for every file every poll: no hashing of the path when nothing is stuck.
        !self.stuck.is_empty() && self.stuck.contains_key(path)
    }

    /// Reads `path`, which `meta` (from following symlinks) describes. Refuses what is not a
    /// regular file or is too large without opening it. If an earlier read of `path` is still
    /// stuck, answers [`ReadError::TimedOut`] at once; if it has finished since, its (possibly
    /// stale) result is dropped and a fresh read is made.
    pub fn read(&mut self, path: &Path, meta: &fs::Metadata) -> Result<String, ReadError> {
        check(&meta.file_type(), meta.len(), self.limit)?;
        if let Some(pending) = self.stuck.get(path) {
            match pending.try_recv() {
                Err(TryRecvError::Empty) => return Err(ReadError::TimedOut(self.timeout)),
                Ok(_) | Err(TryRecvError::Disconnected) => {
                    self.stuck.remove(path);
                }
            }
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let owned = path.to_path_buf();
        let (read, limit) = (self.read, self.limit);
        std::thread::Builder::new()
            .name("file-read".into())
            .spawn(move || {
                // The receiver may be gone (the watcher stopped); nothing to do then.
                let _ = tx.send(read(&owned, limit));
                // The content was allocated here and is freed on another thread: this thread's
                // unmoved count must reach the shared sum before it ends, or every read would
                // lower `mcp_adapter_heap_bytes` by the file's size (seen by the soak: the
                // file adapter's count fell to 0 within a few hundred changes).
                mcp_runtime::heap::flush_this_thread();
            })
            .map_err(ReadError::Spawn)?;
        match rx.recv_timeout(self.timeout) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => {
                warn!(
                    file = %path.display(),
                    timeout_ms = self.timeout.as_millis(),
                    "File read is stuck; serving its last good content until it finishes."
                );
                self.stuck.insert(path.to_path_buf(), rx);
                Err(ReadError::TimedOut(self.timeout))
            }
            Err(RecvTimeoutError::Disconnected) => Err(ReadError::ReaderFailed),
        }
    }
}

/// Refuses anything but a regular file of at most `limit` bytes.
fn check(file_type: &FileType, len: u64, limit: u64) -> Result<(), ReadError> {
    if !file_type.is_file() {
        return Err(ReadError::NotRegular(kind(file_type)));
    }
    if len > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(())
}

/// Opens and reads a regular file of at most `limit` bytes. The type is checked again on the
/// open handle because the path may have been replaced since it was stat'ed; the size is
/// enforced while reading because the file may grow.
pub fn read_regular(path: &Path, limit: u64) -> Result<String, ReadError> {
    let file = File::open(path).map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    check(&meta.file_type(), meta.len(), limit)?;
    let capacity = usize::try_from(meta.len()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(capacity);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > limit) {
        return Err(ReadError::TooLarge { limit });
    }
    String::from_utf8(bytes)
        .map_err(|e| ReadError::Io(io::Error::new(io::ErrorKind::InvalidData, e.utf8_error())))
}

/// What a non-regular file is, for messages.
fn kind(file_type: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "named pipe";
        }
        if file_type.is_char_device() {
            return "character device";
        }
        if file_type.is_block_device() {
            return "block device";
        }
        if file_type.is_socket() {
            return "socket";
        }
    }
    if file_type.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn refuses_pipes_devices_and_big_files_without_opening_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pipe = dir.path().join("p.yaml");
        let status = std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .expect("mkfifo");
        assert!(status.success());
        let mut reader = Reader::new(Duration::from_secs(5), 100);
        let meta = fs::metadata(&pipe).expect("stat");
        let e = reader.read(&pipe, &meta).expect_err("a pipe");
        assert_eq!(e.to_string(), "not a regular file: named pipe");

        let zero = Path::new("/dev/zero");
        let meta = fs::metadata(zero).expect("stat");
        let e = reader.read(zero, &meta).expect_err("a device");
        assert_eq!(e.to_string(), "not a regular file: character device");

        let big = dir.path().join("big.yaml");
        fs::write(&big, [b'#'; 101]).expect("write");
        let meta = fs::metadata(&big).expect("stat");
        let e = reader.read(&big, &meta).expect_err("too big");
        assert_eq!(e.to_string(), "larger than 100 bytes (--max-file-size)");

        fs::write(&big, [b'#'; 100]).expect("write");
        let meta = fs::metadata(&big).expect("stat");
        assert_eq!(reader.read(&big, &meta).expect("fits").len(), 100);
    }

    #[test]
    fn the_open_handle_is_checked_too() {
        // Stat'ed as a file, then swapped for something else: refused after opening.
        let e = read_regular(Path::new("/dev/null"), 100).expect_err("a device");
        assert_eq!(e.to_string(), "not a regular file: character device");
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("bad.yaml");
        fs::write(&f, [0xff, 0xfe]).expect("write");
        let e = read_regular(&f, 100).expect_err("not UTF-8");
        assert!(
            e.to_string().starts_with("cannot read: invalid utf-8"),
            "{e}"
        );
    }

    static STARTED: AtomicUsize = AtomicUsize::new(0);

    /// A read that takes 400 ms, counting how many were started.
    fn slow_read(_: &Path, _: u64) -> Result<String, ReadError> {
        STARTED.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(400));
        Ok("slow".into())
    }

    #[test]
    fn a_stuck_read_times_out_and_is_not_started_twice() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("a.yaml");
        fs::write(&f, "x").expect("write");
        let meta = fs::metadata(&f).expect("stat");
        let mut reader = Reader::with_read_fn(Duration::from_millis(50), 100, slow_read);

        let e = reader.read(&f, &meta).expect_err("times out");
        assert_eq!(e.to_string(), "read timed out after 0.05s (--read-timeout)");
        assert!(reader.is_stuck(&f));
        // Still stuck: answered at once, no second read started.
        let e = reader.read(&f, &meta).expect_err("still stuck");
        assert!(matches!(e, ReadError::TimedOut(_)), "{e}");
        assert_eq!(STARTED.load(Ordering::SeqCst), 1);

        // Once the stuck read finished, the next read is a fresh one (and may be slow again).
        // Asked until then: each read while it is stuck is answered at once without starting
        // another (a sleep of 500 ms for the 400 ms read was too short on a busy machine).
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while STARTED.load(Ordering::SeqCst) == 1 {
            assert!(
                std::time::Instant::now() < end,
                "the stuck read never finished"
            );
            std::thread::sleep(Duration::from_millis(20));
            let e = reader.read(&f, &meta).expect_err("stuck, then slow again");
            assert!(matches!(e, ReadError::TimedOut(_)), "{e}");
        }
        assert_eq!(STARTED.load(Ordering::SeqCst), 2);
        assert!(reader.is_stuck(&f), "the fresh read is stuck in turn");
    }
}
