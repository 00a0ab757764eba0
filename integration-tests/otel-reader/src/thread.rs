//! OTEP 4947's reading protocol: stop a thread, find its `otel_thread_ctx_v1`, read
//! the record it points at.

use nix::sys::ptrace;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::elf::{TlsSymbol, find_tls_symbol};
use crate::read_memory;

/// The symbol OTEP 4947 names.
pub const SYMBOL: &str = "otel_thread_ctx_v1";

/// A thread context record as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRecord {
    /// Trace id (W3C bytes), as 32 lowercase hex digits.
    pub trace_id: String,
    /// Span id, as 16 lowercase hex digits.
    pub span_id: String,
    /// W3C trace flags.
    pub trace_flags: u8,
    /// The attributes, keys resolved through the key map (the last of a repeated
    /// key wins; unknown indexes ignored).
    pub attributes: Vec<(String, String)>,
}

impl ThreadRecord {
    /// The attribute `key`.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// One read of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadRead {
    /// The pointer was null: no context attached.
    Empty,
    /// A record whose `valid` byte was not 1 (the value).
    Invalid(u8),
    /// A valid record.
    Record(ThreadRecord),
}

/// Reads the thread contexts of one process.
#[derive(Debug, Clone)]
pub struct ThreadContextReader {
    pid: i32,
    symbol: TlsSymbol,
    key_map: Vec<String>,
}

impl ThreadContextReader {
    /// Finds `otel_thread_ctx_v1` in the `.dynsym` of `pid`'s executable; `key_map`
    /// is the process context's `threadlocal.attribute_key_map`. `None` when the
    /// executable exports no such TLS symbol.
    pub fn new(pid: i32, key_map: Vec<String>) -> Option<ThreadContextReader> {
        let elf = std::fs::read(format!("/proc/{pid}/exe")).ok()?;
        Some(ThreadContextReader {
            pid,
            symbol: find_tls_symbol(&elf, SYMBOL)?,
            key_map,
        })
    }

    /// The symbol as found.
    pub fn symbol(&self) -> TlsSymbol {
        self.symbol
    }

    /// Stops thread `tid` (ptrace seize and interrupt), reads its context while it is
    /// stopped, and lets it go. `at` runs while the thread is stopped (a clock read:
    /// what was read is the thread's context at that instant).
    pub fn read<T>(&self, tid: i32, at: impl FnOnce() -> T) -> Result<(ThreadRead, T), String> {
        let t = Pid::from_raw(tid);
        ptrace::seize(t, ptrace::Options::empty()).map_err(|e| format!("seize {tid}: {e}"))?;
        let result = (|| {
            ptrace::interrupt(t).map_err(|e| format!("interrupt {tid}: {e}"))?;
            loop {
                match waitpid(t, Some(WaitPidFlag::__WALL)) {
                    Ok(WaitStatus::PtraceEvent(..)) | Ok(WaitStatus::Stopped(..)) => break,
                    Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) => {
                        return Err(format!("thread {tid} exited"));
                    }
                    Ok(_) => continue,
                    Err(e) => return Err(format!("waitpid {tid}: {e}")),
                }
            }
            let when = at();
            let regs = ptrace::getregs(t).map_err(|e| format!("getregs {tid}: {e}"))?;
            let read = self.read_stopped(tid, regs.fs_base)?;
            Ok((read, when))
        })();
        let _ = ptrace::detach(t, None);
        result
    }

    /// The context of a stopped thread whose thread pointer is `tp`.
    fn read_stopped(&self, tid: i32, tp: u64) -> Result<ThreadRead, String> {
        let var = self.symbol.address(tp);
        let ptr = u64::from_ne_bytes(read_memory(tid, var, 8)?.try_into().expect("8 bytes"));
        if ptr == 0 {
            return Ok(ThreadRead::Empty);
        }
        if ptr % 2 != 0 {
            return Err(format!("record at {ptr:#x} is not 2-aligned"));
        }
        let head = read_memory(tid, ptr, 28)?;
        if head[24] != 1 {
            return Ok(ThreadRead::Invalid(head[24]));
        }
        let size = u16::from_ne_bytes([head[26], head[27]]) as usize;
        let data = read_memory(tid, ptr + 28, size)?;
        let mut attributes: Vec<(String, String)> = Vec::new();
        let mut at = 0;
        while at + 2 <= data.len() {
            let (key, len) = (data[at] as usize, data[at + 1] as usize);
            if at + 2 + len > data.len() {
                break;
            }
            let value = String::from_utf8_lossy(&data[at + 2..at + 2 + len]).into_owned();
            at += 2 + len;
            let Some(key) = self.key_map.get(key) else {
                continue;
            };
            attributes.retain(|(k, _)| k != key);
            attributes.push((key.clone(), value));
        }
        Ok(ThreadRead::Record(ThreadRecord {
            trace_id: hex(&head[..16]),
            span_id: hex(&head[16..24]),
            trace_flags: head[25],
            attributes,
        }))
    }

    /// The threads of the process now, with their names.
    pub fn threads(&self) -> Vec<(i32, String)> {
        threads(self.pid)
    }
}

/// The threads of `pid`, with their names (`comm`).
pub fn threads(pid: i32) -> Vec<(i32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some((tid, name.trim().to_owned()))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
