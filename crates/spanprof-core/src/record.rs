//! The label record: the identity of the work being polled, as the signal handler
//! reads it through the thread's label slot. Its own module so that the slot and the
//! handler (in `sys`) and the public label handles (`labels`) all depend on it, and
//! it on nothing of theirs.

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::intern::{self, NameId};
use crate::profile::{Hotness, SampleLabels};
use crate::sys::pool::RecordRef;

/// The identity a sample carries, as ids: written once into a [`LabelRecord`],
/// copied as one value into each sample by the signal handler, carried so through the
/// ring and the collector's queue, and resolved to strings ([`SampleLabels`]) once per
/// sample by the collector, whose result the store and the profile windows share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub(crate) struct LabelIds {
    pub(crate) trace_id: u128,
    pub(crate) span_id: u64,
    pub(crate) parent_span_id: u64,
    pub(crate) root_span_id: u64,
    pub(crate) span_name: NameId,
    pub(crate) route: NameId,
}

impl LabelIds {
    /// No trace, no span, no names.
    pub(crate) const NONE: LabelIds = LabelIds {
        trace_id: 0,
        span_id: 0,
        parent_span_id: 0,
        root_span_id: 0,
        span_name: NameId::NONE,
        route: NameId::NONE,
    };

    /// The ids of work still running after its span ended: no trace or span ids, the
    /// detached span name, the route kept.
    #[inline(always)]
    pub(crate) const fn detached(route: NameId) -> LabelIds {
        LabelIds {
            span_name: NameId::DETACHED,
            route,
            ..LabelIds::NONE
        }
    }

    /// Whether a span (or at least a trace) is named: what the store keeps per span.
    pub(crate) fn has_span(&self) -> bool {
        self.span_id != 0 || self.trace_id != 0
    }

    /// Whether anything is named at all, a route at least: what profile windows label.
    pub(crate) fn is_named(&self) -> bool {
        self.has_span() || self.route != NameId::NONE
    }

    /// The same identity with its names resolved to strings.
    pub(crate) fn resolve(&self, hot: Hotness) -> SampleLabels {
        SampleLabels {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            root_span_id: self.root_span_id,
            span_name: intern::resolve(self.span_name),
            route: intern::resolve(self.route),
            hot,
        }
    }
}

/// The record a label slot points at. Immutable but for the atomics, so a signal
/// handler that reads it through the slot's pointer never sees a torn value.
///
/// With the feature `otel-thread-ctx` it begins with its OpenTelemetry thread context
/// record (`#[repr(C)]`, offset 0), so the slot's pointer to it is also a pointer to
/// that record, as `otel_thread_ctx_v1` must hold (`sys::thread_ctx`).
#[derive(Debug)]
#[cfg_attr(spanprof_otel_ctx, repr(C))]
pub(crate) struct LabelRecord {
    #[cfg(spanprof_otel_ctx)]
    pub(crate) otel: ThreadCtxRecord,
    pub(crate) ids: LabelIds,
    /// A [`crate::Hotness`] in the low bits, raised while the work runs (slow promotion),
    /// and [`ENDED`] once the span has ended. Read as an `i8`, the byte is positive
    /// exactly when the work is hot and its span still live ([`LabelRecord::is_hot`]).
    pub(crate) state: AtomicU8,
    /// Live [`crate::SpanLabels`] handles. The span ends when the last one drops (or at
    /// [`crate::SpanLabels::end`]); references that only carry the labels into other work
    /// (inherited by spawned tasks, `spawn_blocking`, `spawn_local`) do not count.
    pub(crate) owners: AtomicUsize,
    /// Samples taken while this record was in a slot (updated by the signal handler).
    pub(crate) cpu_samples: AtomicU64,
    /// The weighted CPU estimate of those samples, in nanoseconds.
    pub(crate) cpu_ns: AtomicU64,
    /// The local root's record when this is an inner span: the handler adds this
    /// span's samples to the root's counters too, so a root's figures cover its tree.
    pub(crate) root: Option<RecordRef>,
    /// CLOCK_MONOTONIC time after which the work is promoted to `Slow` (0: never).
    pub(crate) slow_deadline_ns: u64,
    /// High sampling period for this work in ns (0: the profiler's).
    pub(crate) high_ns: u64,
    /// An integration's word kept with the labels (`spanprof-tower`: the span id
    /// whose OpenTelemetry context is attached while this span is entered).
    pub(crate) anchor: u64,
    /// Poll accounting published by whoever polls this work ([`crate::PollStats`]).
    pub(crate) busy_ns: AtomicU64,
    pub(crate) polls: AtomicU64,
    pub(crate) max_poll_ns: AtomicU64,
    /// [`SAMPLED`] once the signal handler has counted a sample on this record (or, for
    /// a local root, on one of its tree); [`HANDLED`] once a pop has looked at that;
    /// [`REPORT`] if the span is to be handed to the first-sample hook then
    /// (`crate::registration`).
    pub(crate) flags: AtomicU8,
    /// References to this record ([`RecordRef`]'s count).
    pub(crate) refs: AtomicUsize,
    /// The W3C trace flags of the span (bit 0: sampled), inherited by its children.
    pub(crate) trace_flags: u8,
}

/// [`LabelRecord::flags`]: a sample was counted on the record.
pub(crate) const SAMPLED: u8 = 1;
/// [`LabelRecord::flags`]: a pop has seen [`SAMPLED`] (and handed the span over if
/// [`REPORT`]).
pub(crate) const HANDLED: u8 = 2;
/// [`LabelRecord::flags`]: hand the span to the first-sample hook.
pub(crate) const REPORT: u8 = 4;

/// The bit of [`LabelRecord::state`] set when the span has ended. From then on the
/// signal handler writes samples of work still running under these labels as
/// *detached* (no trace or span id, span name [`crate::DETACHED_SPAN_NAME`], the route
/// kept) at the baseline rate, and counts nothing on the span.
pub(crate) const ENDED: u8 = 0x80;
/// The bits of [`LabelRecord::state`] holding the [`crate::Hotness`].
pub(crate) const HOT_BITS: u8 = 0x7f;

impl LabelRecord {
    /// Whether the work is hot and its span has not ended: one load and one signed
    /// compare, on every labelled poll.
    #[inline(always)]
    pub(crate) fn is_hot(&self) -> bool {
        (self.state.load(Ordering::Relaxed) as i8) > 0
    }

    /// Raises the hotness to at least `why`; never lowers it, and does nothing once
    /// the span has ended (an ended record's byte has the top bit set, above every
    /// hotness). The one place work is promoted: by the poll path
    /// ([`crate::PollTimer`]), the signal handler (inside a long poll) and
    /// [`crate::SpanLabels::promote`]. Returns the new state byte.
    #[inline(always)]
    pub(crate) fn promote(&self, why: Hotness) -> u8 {
        self.state
            .fetch_max(why as u8, Ordering::Relaxed)
            .max(why as u8)
    }

    /// Adds one poll of `ns` nanoseconds to the figures (polls of one span may run
    /// on several threads at once: a span entered by tasks it was handed to).
    #[inline]
    pub(crate) fn account_poll(&self, ns: u64) {
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        self.polls.fetch_add(1, Ordering::Relaxed);
        if ns > self.max_poll_ns.load(Ordering::Relaxed) {
            self.max_poll_ns.fetch_max(ns, Ordering::Relaxed);
        }
    }

    /// Marks the span ended (idempotent). Returns whether this call ended hot work
    /// (the caller then lets the thread drop its high rate, `threads::on_hot_end`).
    pub(crate) fn end(&self) -> bool {
        // An outside reader must not charge work that outlives the span to it (the
        // handler writes such samples as detached): from now on the record reads
        // as invalid, whichever thread's slot holds it.
        #[cfg(spanprof_otel_ctx)]
        self.otel.valid.store(0, Ordering::Relaxed);
        (self.state.fetch_or(ENDED, Ordering::Release) as i8) > 0
    }
}

/// OTEP 4947's thread context record, as outside readers read it: trace id and span
/// id (W3C byte order), `valid` (1) and the W3C trace flags, then `attrs_size` bytes
/// of attributes, each a key index into the process context's
/// `threadlocal.attribute_key_map` ([`crate::otel_ctx::ATTRIBUTE_KEYS`]), a length
/// and that many UTF-8 bytes. Packed as the OTEP lays it out (28 bytes before the
/// attributes, no padding: `#[repr(C)]` puts every field at its natural alignment).
///
/// Written once when the labels are built; only `valid` changes after, cleared when
/// the span ends.
#[cfg(spanprof_otel_ctx)]
#[repr(C)]
pub(crate) struct ThreadCtxRecord {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
    pub(crate) valid: AtomicU8,
    pub(crate) trace_flags: u8,
    pub(crate) attrs_size: u16,
    pub(crate) attrs: [u8; THREAD_CTX_ATTRS],
}

/// Room for the attributes: the route and the span name, each at most
/// [`crate::MAX_NAME_LEN`] bytes after its key and length. The whole record (288
/// bytes) stays under the 640 the OTEP recommends.
#[cfg(spanprof_otel_ctx)]
pub(crate) const THREAD_CTX_ATTRS: usize = 2 * (2 + crate::intern::MAX_NAME_LEN);

#[cfg(spanprof_otel_ctx)]
const _: () = {
    assert!(std::mem::offset_of!(ThreadCtxRecord, valid) == 24);
    assert!(std::mem::offset_of!(ThreadCtxRecord, attrs_size) == 26);
    assert!(std::mem::offset_of!(ThreadCtxRecord, attrs) == 28);
    assert!(std::mem::offset_of!(LabelRecord, otel) == 0);
};

#[cfg(spanprof_otel_ctx)]
impl ThreadCtxRecord {
    /// The record of a span: its ids, flags and attributes (`(key index, value)`,
    /// empty values left out).
    pub(crate) fn new(
        trace_id: u128,
        span_id: u64,
        trace_flags: u8,
        attributes: [(u8, &str); 2],
    ) -> Self {
        let mut attrs = [0u8; THREAD_CTX_ATTRS];
        let mut at = 0;
        for (key, value) in attributes {
            let len = value.len().min(crate::intern::MAX_NAME_LEN);
            if len == 0 {
                continue;
            }
            attrs[at] = key;
            attrs[at + 1] = len as u8;
            attrs[at + 2..at + 2 + len].copy_from_slice(&value.as_bytes()[..len]);
            at += 2 + len;
        }
        // No trace (a request without a trace context gets a span id of spanprof's
        // own): the OTEP wants both ids set or neither, and no flags then.
        let (span_id, trace_flags) = if trace_id == 0 {
            (0, 0)
        } else {
            (span_id, trace_flags)
        };
        ThreadCtxRecord {
            trace_id: trace_id.to_be_bytes(),
            span_id: span_id.to_be_bytes(),
            valid: AtomicU8::new(1),
            trace_flags,
            attrs_size: at as u16,
            attrs,
        }
    }
}

#[cfg(spanprof_otel_ctx)]
impl std::fmt::Debug for ThreadCtxRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCtxRecord")
            .field("valid", &self.valid)
            .field("trace_flags", &self.trace_flags)
            .field("attrs_size", &self.attrs_size)
            .finish_non_exhaustive()
    }
}
