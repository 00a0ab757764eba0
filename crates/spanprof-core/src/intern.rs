//! A bounded, process-wide string interner for span names and routes.
//!
//! Samples carry 32-bit ids instead of strings, so the signal handler copies
//! integers only. Interning happens when labels are built (off the poll path).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

use crate::cache::FastMap;
pub use crate::sys::record::{MAX_NAME_LEN, NameId};

/// Default bound on distinct interned strings.
pub const DEFAULT_MAX_NAMES: usize = 4096;
/// What every name past the bound reads as.
pub const OVERFLOW_NAME: &str = "(other)";

/// The span name of samples taken in work that outlived its span (a task spawned by
/// a request that ended): such samples carry no trace or span id, this name, and
/// the route of the span that started the work.
pub const DETACHED_SPAN_NAME: &str = "(detached)";

impl NameId {
    /// The id of `name` (at most [`MAX_NAME_LEN`] bytes kept), interning it if new.
    pub fn intern(name: &str) -> NameId {
        intern(name)
    }

    /// The id of a `'static` name such as a `tracing` span's, through a cache of
    /// the calling thread's own, keyed by the name's address and length (a `'static`
    /// string is never freed or changed): after a thread's first call for a name, no
    /// lock and no write to memory other threads share (the interner's lock is one
    /// cache line every thread writes). Bounded like [`NameId::intern`]; a name past
    /// the bound is not cached (it may get in once the bound is raised), so it goes
    /// through the interner's lock every time, as with [`NameId::intern`].
    ///
    /// ```
    /// use spanprof_core::NameId;
    /// assert_eq!(NameId::intern_static("validate_order"), NameId::intern("validate_order"));
    /// ```
    #[inline]
    pub fn intern_static(name: &'static str) -> NameId {
        intern_static(name)
    }

    /// The string this id stands for.
    pub fn resolve(self) -> Arc<str> {
        resolve(self)
    }
}

struct Interner {
    ids: FastMap<Arc<str>, NameId>,
    names: Vec<Arc<str>>,
}

static INTERNER: LazyLock<RwLock<Interner>> = LazyLock::new(|| {
    let empty: Arc<str> = Arc::from("");
    let other: Arc<str> = Arc::from(OVERFLOW_NAME);
    let detached: Arc<str> = Arc::from(DETACHED_SPAN_NAME);
    let mut ids = FastMap::default();
    ids.insert(empty.clone(), NameId::NONE);
    ids.insert(other.clone(), NameId::OVERFLOW);
    ids.insert(detached.clone(), NameId::DETACHED);
    RwLock::new(Interner {
        ids,
        names: vec![empty, other, detached],
    })
});
static MAX_NAMES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_NAMES);
static OVERFLOWED: AtomicU64 = AtomicU64::new(0);
static WARNED: AtomicBool = AtomicBool::new(false);
/// Estimated bytes of the names held.
static BYTES: AtomicUsize = AtomicUsize::new(0);

/// Estimated bytes of one name of `len` bytes: its shared allocation, its slot in
/// the id map and in the name table.
fn name_bytes(len: usize) -> usize {
    len + 2 * std::mem::size_of::<usize>()
        + (std::mem::size_of::<(Arc<str>, NameId)>() + 1) * 8 / 7
        + std::mem::size_of::<Arc<str>>()
}

/// Counters of the name interner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InternStats {
    /// Distinct strings held.
    pub names: usize,
    /// The bound.
    pub max_names: usize,
    /// Estimated bytes of the names held.
    pub bytes: usize,
    /// The most `bytes` can reach: `max_names` names of [`MAX_NAME_LEN`] bytes.
    pub max_bytes: usize,
    /// Interning requests that got [`OVERFLOW_NAME`] because the bound was reached
    /// (the first one also logs a warning).
    pub overflowed: u64,
}

/// The interner's counters.
pub fn intern_stats() -> InternStats {
    let g = INTERNER.read().unwrap_or_else(|e| e.into_inner());
    let max_names = MAX_NAMES.load(Ordering::Relaxed);
    InternStats {
        names: g.names.len(),
        max_names,
        bytes: BYTES.load(Ordering::Relaxed),
        max_bytes: max_names * name_bytes(MAX_NAME_LEN),
        overflowed: OVERFLOWED.load(Ordering::Relaxed),
    }
}

/// Sets the bound on distinct names (at least 3, the built-in ones). Names already
/// held stay.
pub fn set_max_names(max: usize) {
    MAX_NAMES.store(max.max(3), Ordering::Relaxed);
}

fn truncate(s: &str) -> &str {
    if s.len() <= MAX_NAME_LEN {
        return s;
    }
    let mut end = MAX_NAME_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(crate) fn intern(s: &str) -> NameId {
    let s = truncate(s);
    if let Some(id) = INTERNER
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .ids
        .get(s)
    {
        return *id;
    }
    let mut g = INTERNER.write().unwrap_or_else(|e| e.into_inner());
    if let Some(id) = g.ids.get(s) {
        return *id;
    }
    let max = MAX_NAMES.load(Ordering::Relaxed);
    if g.names.len() >= max {
        drop(g);
        OVERFLOWED.fetch_add(1, Ordering::Relaxed);
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_names = max,
                "spanprof: the span name and route interner is full ({max} distinct names, never forgotten); \
                 new span names and routes read {OVERFLOW_NAME:?} from now on (counted in spanprof::stats::intern_stats). \
                 Span names and routes must be templates (`/cart/{{id}}`), not raw paths, ids or user input; \
                 spanprof::set_max_names raises the bound"
            );
        }
        return NameId::OVERFLOW;
    }
    let id = NameId(g.names.len() as u32);
    #[cfg(spanprof_otel_ctx)]
    by_id::insert(id, s);
    let arc: Arc<str> = Arc::from(s);
    g.names.push(arc.clone());
    g.ids.insert(arc, id);
    BYTES.fetch_add(name_bytes(s.len()), Ordering::Relaxed);
    id
}

/// The interner's lock, held (see [`crate::hold_name_interner_for_test`]).
#[cfg(feature = "testing")]
#[allow(missing_debug_implementations)]
pub struct InternerHeld {
    _guard: std::sync::RwLockWriteGuard<'static, Interner>,
}

#[cfg(feature = "testing")]
pub(crate) fn hold() -> InternerHeld {
    InternerHeld {
        _guard: INTERNER.write().unwrap_or_else(|e| e.into_inner()),
    }
}

pub(crate) fn resolve(id: NameId) -> Arc<str> {
    let g = INTERNER.read().unwrap_or_else(|e| e.into_inner());
    g.names
        .get(id.0 as usize)
        .cloned()
        .unwrap_or_else(|| g.names[1].clone())
}

/// The string of `id` without the interner's lock (the built-in names and every name
/// interned so far), for building the OpenTelemetry thread context record of each
/// label: a read lock per request is a write to a line every worker shares.
#[cfg(spanprof_otel_ctx)]
pub(crate) fn name_of(id: NameId) -> &'static str {
    match id {
        NameId::NONE => "",
        NameId::OVERFLOW => OVERFLOW_NAME,
        NameId::DETACHED => DETACHED_SPAN_NAME,
        id => by_id::get(id).unwrap_or(OVERFLOW_NAME),
    }
}

/// Interned names by id, lock-free: chunk `c` holds `64 << c` ids, from
/// `64 * (2^c - 1)`, each set once (under the interner's write lock) and never
/// changed. The names are leaked: the interner never forgets one, and their number
/// is bounded ([`set_max_names`]).
#[cfg(spanprof_otel_ctx)]
mod by_id {
    use std::sync::OnceLock;

    use super::NameId;

    const CHUNKS: usize = 26;
    type Chunk = Box<[OnceLock<&'static str>]>;
    static TABLE: [OnceLock<Chunk>; CHUNKS] = [const { OnceLock::new() }; CHUNKS];

    fn place(id: NameId) -> (usize, usize) {
        let n = id.0 as usize / 64 + 1;
        let c = (usize::BITS - 1 - n.leading_zeros()) as usize;
        (c, id.0 as usize - 64 * ((1 << c) - 1))
    }

    pub(super) fn insert(id: NameId, name: &str) {
        let (c, at) = place(id);
        if c >= CHUNKS {
            return;
        }
        let chunk = TABLE[c].get_or_init(|| (0..64usize << c).map(|_| OnceLock::new()).collect());
        let _ = chunk[at].set(Box::leak(name.into()));
    }

    pub(super) fn get(id: NameId) -> Option<&'static str> {
        let (c, at) = place(id);
        TABLE.get(c)?.get()?.get(at)?.get().copied()
    }
}

/// Most `'static` names a thread keeps the ids of; past it the cache starts over.
/// 896 fill a table of 1 024 buckets (7/8) without growing it: about 25 KB a thread.
const STATIC_CACHE_MAX: usize = 896;

thread_local! {
    /// Ids of `'static` names this thread interned, by address and length: a
    /// `'static` string is never freed or changed, so its address stands for it.
    static STATIC_IDS: RefCell<FastMap<(usize, usize), NameId>> = RefCell::new(FastMap::default());
}

/// Places of the direct-mapped cache in front of [`STATIC_IDS`].
const STATIC_RECENT_LEN: usize = 64;

thread_local! {
    /// The last `'static` names this thread asked for, by a hash of their address
    /// (address, length, id): const-initialised, so a hit is one thread-local line,
    /// where the map costs a hash, a lazy thread-local and a borrow.
    static STATIC_RECENT: [Cell<(usize, usize, u32)>; STATIC_RECENT_LEN] =
        const { [const { Cell::new((0, 0, 0)) }; STATIC_RECENT_LEN] };
}

#[inline]
pub(crate) fn intern_static(s: &'static str) -> NameId {
    let key = (s.as_ptr() as usize, s.len());
    let at = (key.0 ^ (key.0 >> 6) ^ key.1) % STATIC_RECENT_LEN;
    if let Ok(Some(id)) = STATIC_RECENT.try_with(|r| {
        let (addr, len, id) = r[at].get();
        (addr == key.0 && len == key.1).then_some(NameId(id))
    }) {
        return id;
    }
    let id = intern_static_slow(s, key);
    if id != NameId::OVERFLOW {
        let _ = STATIC_RECENT.try_with(|r| r[at].set((key.0, key.1, id.0)));
    }
    id
}

#[cold]
fn intern_static_slow(s: &'static str, key: (usize, usize)) -> NameId {
    STATIC_IDS
        .try_with(|ids| {
            if let Some(&id) = ids.borrow().get(&key) {
                return id;
            }
            let id = intern(s);
            // A name past the bound may get in once the bound is raised: not kept.
            if id != NameId::OVERFLOW {
                let mut ids = ids.borrow_mut();
                if ids.len() >= STATIC_CACHE_MAX {
                    ids.clear();
                }
                ids.insert(key, id);
            }
            id
        })
        .unwrap_or_else(|_| intern(s))
}

/// The id of `s` if it was interned before (never inserts).
pub(crate) fn lookup(s: &str) -> Option<NameId> {
    INTERNER
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .ids
        .get(truncate(s))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interns_and_resolves() {
        let a = intern("GET /cart/{id}");
        assert_eq!(intern("GET /cart/{id}"), a);
        assert_eq!(&*resolve(a), "GET /cart/{id}");
        assert_eq!(&*resolve(NameId::NONE), "");
        assert_eq!(&*resolve(NameId::DETACHED), DETACHED_SPAN_NAME);
        assert_eq!(intern(DETACHED_SPAN_NAME), NameId::DETACHED);
        let long = "x".repeat(1000);
        assert_eq!(resolve(intern(&long)).len(), MAX_NAME_LEN);
    }
}
