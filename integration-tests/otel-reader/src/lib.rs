//! A reader of OpenTelemetry's process context (OTEP 4719) and thread context (OTEP
//! 4947) from outside the process, following both reading protocols as written:
//!
//! - [`read_process_context`]: finds the mapping in `/proc/<pid>/maps`, validates the
//!   signature, version and `monotonic_published_at_ns`, copies the payload between
//!   two reads of the timestamp and decodes it with prost and the OTLP messages;
//! - [`ThreadContextReader`]: finds `otel_thread_ctx_v1` in the executable's
//!   `.dynsym`, stops a thread with ptrace, computes the variable's address from the
//!   thread pointer (the executable's TLS block, x86_64's variant II layout) and reads
//!   the record with `process_vm_readv` while the thread is stopped.
//!
//! It shares no code with spanprof's writer: what it knows of the formats is from
//! the OTEPs.
#![forbid(unsafe_code)]

use std::io::IoSliceMut;

use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;

mod elf;
mod thread;

pub use elf::{TlsSymbol, find_tls_symbol};
pub use thread::{ThreadContextReader, ThreadRead, ThreadRecord};

/// OTEP 4719's payload, `opentelemetry.proto.processcontext.v1development.ProcessContext`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessContextMessage {
    /// The Resource of the process.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// Extra attributes (the thread context's `threadlocal.*` reference data).
    #[prost(message, repeated, tag = "2")]
    pub attributes: Vec<KeyValue>,
}

/// A process context as read.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessContext {
    /// The mapping's name in `/proc/<pid>/maps`.
    pub mapping_name: String,
    /// The header's `monotonic_published_at_ns`.
    pub published_at_ns: u64,
    /// The decoded payload.
    pub message: ProcessContextMessage,
}

impl ProcessContext {
    /// The Resource's string attribute `key`.
    pub fn resource_string(&self, key: &str) -> Option<String> {
        string_of(self.message.resource.as_ref()?.attributes.iter(), key)
    }

    /// `threadlocal.schema_version`.
    pub fn schema_version(&self) -> Option<String> {
        string_of(self.message.attributes.iter(), "threadlocal.schema_version")
    }

    /// `threadlocal.attribute_key_map`: the key of each index.
    pub fn attribute_key_map(&self) -> Vec<String> {
        let value = self
            .message
            .attributes
            .iter()
            .find(|kv| kv.key == "threadlocal.attribute_key_map")
            .and_then(|kv| kv.value.as_ref()?.value.as_ref());
        match value {
            Some(any_value::Value::ArrayValue(a)) => a
                .values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(any_value::Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn string_of<'a>(mut kvs: impl Iterator<Item = &'a KeyValue>, key: &str) -> Option<String> {
    match kvs.find(|kv| kv.key == key)?.value.as_ref()? {
        AnyValue {
            value: Some(any_value::Value::StringValue(s)),
        } => Some(s.clone()),
        _ => None,
    }
}

/// Why a process context could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessContextError {
    /// No mapping of the OTEP's names in `/proc/<pid>/maps`.
    NoMapping,
    /// A mapping whose signature or version is not the OTEP's (the found values).
    Invalid(String),
    /// The context was being updated at every try.
    Busy,
    /// Reading the process's memory failed.
    Read(String),
    /// The payload does not decode.
    Decode(String),
}

/// The names `/proc/<pid>/maps` gives the mapping (OTEP 4719, reading protocol 1).
const MAPPING_NAMES: [&str; 3] = [
    "[anon_shmem:OTEL_CTX]",
    "[anon:OTEL_CTX]",
    "/memfd:OTEL_CTX",
];

/// The start address and name of each mapping of `pid` that may hold a process
/// context.
pub fn context_mappings(pid: i32) -> Vec<(u64, String)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(6, ' ');
            let range = fields.next()?;
            let name = fields.nth(4).unwrap_or("").trim_start();
            MAPPING_NAMES.iter().any(|n| name.starts_with(n)).then(|| {
                Some((
                    u64::from_str_radix(range.split('-').next()?, 16).ok()?,
                    name.to_owned(),
                ))
            })?
        })
        .collect()
}

/// Reads `len` bytes at `addr` of process (or thread) `pid`.
pub fn read_memory(pid: i32, addr: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len];
    if len == 0 {
        return Ok(buf);
    }
    let n = process_vm_readv(
        Pid::from_raw(pid),
        &mut [IoSliceMut::new(&mut buf)],
        &[RemoteIoVec {
            base: addr as usize,
            len,
        }],
    )
    .map_err(|e| format!("process_vm_readv {addr:#x}+{len}: {e}"))?;
    if n != len {
        return Err(format!("short read at {addr:#x}: {n} of {len}"));
    }
    Ok(buf)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads the process context of `pid` (OTEP 4719's reading protocol).
pub fn read_process_context(pid: i32) -> Result<ProcessContext, ProcessContextError> {
    let mappings = context_mappings(pid);
    if mappings.is_empty() {
        return Err(ProcessContextError::NoMapping);
    }
    let mut invalid = Vec::new();
    for (addr, name) in mappings {
        // 2. Signature and version.
        let header = read_memory(pid, addr, 32).map_err(ProcessContextError::Read)?;
        if &header[..8] != b"OTEL_CTX" || u32_at(&header, 8) != 2 {
            invalid.push(format!(
                "{name}: signature {:?}, version {}",
                String::from_utf8_lossy(&header[..8]),
                u32_at(&header, 8)
            ));
            continue;
        }
        for _ in 0..1000 {
            // 3. A non-zero timestamp (zero: an update is under way).
            let header = read_memory(pid, addr, 32).map_err(ProcessContextError::Read)?;
            let published = u64_at(&header, 16);
            if published == 0 {
                std::thread::yield_now();
                continue;
            }
            // 4-5. The payload, read after the timestamp.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            let size = u32_at(&header, 12) as usize;
            let payload = read_memory(pid, u64_at(&header, 24), size);
            // 6-7. The timestamp again: unchanged means header and payload agree.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            let again = read_memory(pid, addr + 16, 8).map_err(ProcessContextError::Read)?;
            if u64_at(&again, 0) != published {
                continue;
            }
            let payload = payload.map_err(ProcessContextError::Read)?;
            // 8. Decode.
            let message = <ProcessContextMessage as prost::Message>::decode(payload.as_slice())
                .map_err(|e| ProcessContextError::Decode(e.to_string()))?;
            return Ok(ProcessContext {
                mapping_name: name,
                published_at_ns: published,
                message,
            });
        }
        return Err(ProcessContextError::Busy);
    }
    Err(ProcessContextError::Invalid(invalid.join("; ")))
}

/// `CLOCK_BOOTTIME` now, in ns (the clock of `monotonic_published_at_ns`).
pub fn boottime_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("CLOCK_BOOTTIME");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}
