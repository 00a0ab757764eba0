//! DWARF call-frame unwinding in the signal handler: framehop over the
//! `.eh_frame_hdr` and `.eh_frame` of every loaded module, read in place.
//!
//! A frame-pointer walk stops in any code built without frame pointers (glibc's
//! allocator, C libraries, a build whose `RUSTFLAGS` dropped the flag). The call-frame
//! information that every module carries for exceptions (`.eh_frame`, with its
//! binary-search index `.eh_frame_hdr`) says, for every instruction, where the return
//! address and the caller's frame are, so the walk goes on through them.
//!
//! How it stays signal-safe:
//! - **The module list** is built off the handler ([`refresh`]: `dl_iterate_phdr`),
//!   published through one atomic pointer and never freed (a list that was replaced
//!   stays allocated: a handler may still be reading it). A new list is made only when
//!   the set of modules changed, at most once per [`REFRESH_INTERVAL`], and only after
//!   the handler met an address no module covers (code loaded with `dlopen`).
//! - **The unwind data** is the modules' own mapped memory, no copy. Every library in
//!   a list is pinned first (`dlopen` with `RTLD_NOLOAD | RTLD_NODELETE`), so
//!   `dlclose` can never unmap what a handler may read; the executable and the vDSO
//!   are never unmapped anyway.
//! - **The caches** (framehop's rule caches and gimli's evaluation contexts) are a
//!   pool made at profiler start, as many as the CPUs and two more: a handler takes a
//!   free one for its walk (one atomic exchange) and gives it back, so memory does
//!   not grow with the threads registered.
//! - **Stack reads** are bounds-checked against the interrupted thread's stack: a
//!   read outside `[sp, stack_hi)` fails and ends the walk.
//! - framehop with [`MustNotAllocateDuringUnwind`] allocates nothing while unwinding
//!   (the `handler_alloc` test counts).

use std::cell::UnsafeCell;
use std::ffi::{CStr, CString};
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

use super::MAX_FRAMES;
use super::unwind::Regs;

/// An unwind cache: framehop's per-address rule caches and the gimli contexts they
/// evaluate call-frame programs in, preallocated. [`WAYS`] caches of 509 rules each,
/// an address's chosen by a hash of it: one thrashed in a server's stacks (17.5 % of
/// frames missed, each about 0.4 µs instead of 16 ns; 2.6 % with four).
pub(crate) struct UnwindCache([CacheX86_64<MustNotAllocateDuringUnwind>; WAYS]);

/// framehop caches in one [`UnwindCache`] (each holds 509 rules).
pub(crate) const WAYS: usize = 4;

impl UnwindCache {
    /// A cache (allocates; never in the handler).
    pub(crate) fn new() -> Box<Self> {
        Box::new(UnwindCache(std::array::from_fn(|_| CacheX86_64::new_in())))
    }

    /// The cache for the frame at lookup address `addr`: top bits of a multiplicative
    /// hash (framehop indexes its own slots by `addr % 509`).
    #[inline(always)]
    fn way(&mut self, addr: u64) -> &mut CacheX86_64<MustNotAllocateDuringUnwind> {
        const SHIFT: u32 = 64 - WAYS.trailing_zeros();
        &mut self.0[(addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> SHIFT) as usize]
    }

    /// Rule lookups so far, and how many of them missed (the frame's call-frame
    /// program was found and run).
    #[inline(always)]
    fn lookups_and_misses(&self) -> (u64, u64) {
        self.0.iter().fold((0, 0), |(t, m), c| {
            let s = c.stats();
            (t + s.total(), m + s.misses())
        })
    }
}

const _: () = assert!(WAYS.is_power_of_two() && WAYS > 1);

/// One cache of the pool and whether a handler holds it.
struct Pooled {
    busy: AtomicBool,
    cache: UnsafeCell<Box<UnwindCache>>,
}

// SAFETY: `cache` is only reached through `Pool::take`, which hands it to one holder
// at a time (`busy`, acquired with acquire ordering, released with release).
unsafe impl Sync for Pooled {}

/// The caches the signal handlers share: a handler takes a free one for its walk and
/// gives it back. As many as the CPUs and two more (4 to 64, about 144 KB each):
/// handlers run at once on at most as many threads as there are CPUs (more only when
/// one is preempted inside the handler), so the memory is bounded by the machine,
/// not by the threads registered (a blocking pool may hold hundreds), and workers
/// running the same code share its rules.
static POOL: OnceLock<Box<[Pooled]>> = OnceLock::new();

/// Makes the pool (once; off the handler).
fn pool() -> &'static [Pooled] {
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get() * 2)
            .clamp(4, 128);
        (0..n)
            .map(|_| Pooled {
                busy: AtomicBool::new(false),
                cache: UnsafeCell::new(UnwindCache::new()),
            })
            .collect()
    })
}

/// A cache of the pool, held until dropped.
pub(crate) struct HeldCache(&'static Pooled);

impl HeldCache {
    /// A free cache of the pool, looked for from place `hint` on (a thread's own
    /// starting place, so threads rarely try the same one). `None` when every cache is
    /// held (more handlers at once than the pool has caches: threads preempted inside
    /// the handler), or before the pool is made. Async-signal-safe: atomics only.
    #[inline(always)]
    pub(crate) fn take(hint: usize) -> Option<HeldCache> {
        let pool = POOL.get()?;
        let n = pool.len();
        (0..n).map(|k| &pool[(hint + k) % n]).find_map(|p| {
            // `then`, not `then_some`: a `HeldCache` made for a cache another handler
            // holds would free it when dropped.
            p.busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
                .then(|| HeldCache(p))
        })
    }

    /// The cache.
    #[inline(always)]
    pub(crate) fn cache(&mut self) -> &mut UnwindCache {
        // SAFETY: this holder set `busy` (`take`) and clears it only when dropped, so
        // no other reference to the cache exists meanwhile.
        unsafe { &mut *self.0.cache.get() }
    }
}

impl Drop for HeldCache {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// Bytes of a loaded module, in place: memory that stays mapped for the rest of the
/// process (see [`pin`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct LoadedBytes(&'static [u8]);

impl Deref for LoadedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0
    }
}

type ProcessUnwinder = UnwinderX86_64<LoadedBytes, MustNotAllocateDuringUnwind>;

/// The modules the handler unwinds through: framehop's unwinder over them, and their
/// code ranges to tell an address that none covers.
pub(crate) struct ModuleMap {
    unwinder: ProcessUnwinder,
    /// Absolute code ranges, sorted by start.
    code: Vec<Range<u64>>,
    /// (load bias, name) of each module, to see whether a fresh read differs.
    ids: Vec<(u64, String)>,
}

impl ModuleMap {
    /// Whether `addr` lies in the code of a module of this map.
    pub(crate) fn covers(&self, addr: u64) -> bool {
        let i = self.code.partition_point(|r| r.start <= addr);
        i > 0 && self.code[i - 1].contains(&addr)
    }

    /// Modules in this map.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// The map the handler uses; null until the profiler first starts.
static CURRENT: AtomicPtr<ModuleMap> = AtomicPtr::new(std::ptr::null_mut());
/// Set by the handler when a stack ended at an address no module covers.
static UNKNOWN_CODE: AtomicBool = AtomicBool::new(false);
/// Maps published so far (each stays allocated for good).
static PUBLISHED: AtomicU64 = AtomicU64::new(0);
/// When the modules were last read.
static LAST_READ: Mutex<Option<Instant>> = Mutex::new(None);

/// Least time between two reads of the module list prompted by unknown code.
pub(crate) const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Whether the handler unwinds by DWARF (the profiler's [`crate::Unwinding`]).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Chooses between DWARF and frame-pointer unwinding for the samples to come.
pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// The published map, if any. Async-signal-safe (one atomic load).
#[inline(always)]
pub(crate) fn current() -> Option<&'static ModuleMap> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: a non-null CURRENT is a map made by `Box::into_raw` in `refresh` and
    // never freed.
    unsafe { p.as_ref() }
}

/// The map the handler unwinds with: the published one, unless frame pointers
/// were chosen. Async-signal-safe (two atomic loads).
#[inline(always)]
pub(crate) fn in_use() -> Option<&'static ModuleMap> {
    if ENABLED.load(Ordering::Relaxed) {
        current()
    } else {
        None
    }
}

/// Reads the modules and publishes a map of them if none is published yet or the
/// set changed since. With `only_if_asked`, does so only when the handler met
/// unknown code and [`REFRESH_INTERVAL`] has passed since the last read. Off the
/// handler only (allocates, calls the dynamic loader).
pub(crate) fn refresh(only_if_asked: bool) {
    if only_if_asked && !UNKNOWN_CODE.load(Ordering::Relaxed) {
        return;
    }
    {
        let mut last = LAST_READ.lock().unwrap_or_else(|e| e.into_inner());
        if only_if_asked && last.is_some_and(|t| t.elapsed() < REFRESH_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
    }
    UNKNOWN_CODE.store(false, Ordering::Relaxed);
    pool();
    let modules = pinned_modules();
    if current().is_some_and(|m| m.ids.len() == modules.len() && same_ids(&m.ids, &modules)) {
        return;
    }
    let map = build(&modules);
    tracing::debug!(
        modules = map.len(),
        "spanprof: unwind information of the loaded modules published"
    );
    CURRENT.store(Box::into_raw(Box::new(map)), Ordering::Release);
    PUBLISHED.fetch_add(1, Ordering::Relaxed);
}

fn same_ids(ids: &[(u64, String)], modules: &[LoadedModule]) -> bool {
    ids.iter()
        .zip(modules)
        .all(|((bias, name), m)| *bias == m.bias && *name == m.name)
}

/// Module maps published so far in this process (each stays allocated).
#[cfg(test)]
fn maps_published() -> u64 {
    PUBLISHED.load(Ordering::Relaxed)
}

/// A loaded module as `dl_iterate_phdr` describes it (addresses as stated in the
/// file; add `bias` for where they are).
#[derive(Debug, Clone, PartialEq, Eq)]
struct LoadedModule {
    name: String,
    bias: u64,
    /// Lowest start to highest end of the executable `PT_LOAD` segments.
    code: Range<u64>,
    /// `PT_GNU_EH_FRAME`: the `.eh_frame_hdr` section.
    eh_frame_hdr: Option<Range<u64>>,
    /// The `PT_LOAD` segments' file-backed ranges.
    loads: Vec<Range<u64>>,
}

/// The loaded modules with code, each library pinned so that it is never unmapped,
/// read twice around the pinning so that none unloaded in between is kept.
fn pinned_modules() -> Vec<LoadedModule> {
    let first = loaded_modules();
    let pinned: Vec<&LoadedModule> = first.iter().filter(|m| pin(&m.name)).collect();
    let mut modules: Vec<LoadedModule> = loaded_modules()
        .into_iter()
        .filter(|m| pinned.iter().any(|p| p.name == m.name && p.bias == m.bias))
        .collect();
    modules.sort_by_key(|m| m.bias + m.code.start);
    modules
}

/// Keeps a module mapped for the rest of the process. The executable (no name) and
/// the vDSO are never unmapped; a library is pinned with `RTLD_NODELETE` (`dlclose`
/// then leaves it mapped).
fn pin(name: &str) -> bool {
    if name.is_empty() || name.starts_with("linux-vdso") || name.starts_with("linux-gate") {
        return true;
    }
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: `c` is NUL-terminated; RTLD_NOLOAD loads nothing new, it only finds
    // the library already loaded and marks it never to be unloaded. The handle is
    // never closed.
    let handle = unsafe {
        libc::dlopen(
            c.as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        )
    };
    !handle.is_null()
}

/// Every loaded module with executable code, from `dl_iterate_phdr`.
fn loaded_modules() -> Vec<LoadedModule> {
    extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `&mut Vec` passed to dl_iterate_phdr below, alive for
        // the call; `info` is valid for this callback.
        let (out, info) = unsafe { (&mut *(data as *mut Vec<LoadedModule>), &*info) };
        let name = if info.dlpi_name.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null dlpi_name is a NUL-terminated string of the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }
                .to_string_lossy()
                .into_owned()
        };
        let phdrs = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: the loader's program headers: `dlpi_phnum` entries.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        let mut code: Option<Range<u64>> = None;
        let mut eh_frame_hdr = None;
        let mut loads = Vec::new();
        for ph in phdrs {
            let range = ph.p_vaddr..ph.p_vaddr.saturating_add(ph.p_memsz);
            match ph.p_type {
                libc::PT_LOAD => {
                    loads.push(ph.p_vaddr..ph.p_vaddr.saturating_add(ph.p_filesz));
                    if ph.p_flags & libc::PF_X != 0 {
                        code = Some(match code {
                            Some(c) => c.start.min(range.start)..c.end.max(range.end),
                            None => range,
                        });
                    }
                }
                libc::PT_GNU_EH_FRAME => eh_frame_hdr = Some(range),
                _ => {}
            }
        }
        if let Some(code) = code {
            out.push(LoadedModule {
                name,
                bias: info.dlpi_addr,
                code,
                eh_frame_hdr,
                loads,
            });
        }
        0
    }
    let mut out: Vec<LoadedModule> = Vec::new();
    // SAFETY: `each` matches the callback type and only uses `data` as the `Vec`
    // passed here, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut out as *mut Vec<LoadedModule> as *mut _) };
    out
}

/// framehop's unwinder over `modules` (sorted by code start).
fn build(modules: &[LoadedModule]) -> ModuleMap {
    let mut unwinder = ProcessUnwinder::new();
    let mut code = Vec::with_capacity(modules.len());
    let mut ids = Vec::with_capacity(modules.len());
    for m in modules {
        let avma = m.bias + m.code.start..m.bias + m.code.end;
        let mut info = ExplicitModuleSectionInfo::<LoadedBytes> {
            base_svma: 0,
            text_svma: Some(m.code.clone()),
            ..Default::default()
        };
        if let Some((hdr, eh_frame)) = m.eh_frame_hdr.clone().and_then(|h| unwind_sections(m, h)) {
            info.eh_frame_hdr_svma = Some(hdr.0);
            info.eh_frame_hdr = Some(hdr.1);
            info.eh_frame_svma = Some(eh_frame.0);
            info.eh_frame = Some(eh_frame.1);
        }
        unwinder.add_module(framehop::Module::new(
            m.name.clone(),
            avma.clone(),
            m.bias,
            info,
        ));
        code.push(avma);
        ids.push((m.bias, m.name.clone()));
    }
    ModuleMap {
        unwinder,
        code,
        ids,
    }
}

type Section = (Range<u64>, LoadedBytes);

/// `.eh_frame_hdr` and `.eh_frame` of a module, in place. `.eh_frame` has no size in
/// the program headers: it runs from where the header points to the end of the
/// segment holding it (framehop reads only the entries the header's table indexes).
fn unwind_sections(m: &LoadedModule, hdr: Range<u64>) -> Option<(Section, Section)> {
    let segment_of = |r: &Range<u64>| {
        m.loads
            .iter()
            .find(|l| l.start <= r.start && r.end <= l.end)
    };
    segment_of(&hdr)?;
    let hdr_bytes = loaded(m.bias, &hdr)?;
    let eh_frame_start = eh_frame_ptr(&hdr_bytes, hdr.start)?;
    let eh_frame = eh_frame_start..segment_of(&(eh_frame_start..eh_frame_start + 1))?.end;
    let eh_frame_bytes = loaded(m.bias, &eh_frame)?;
    Some(((hdr, hdr_bytes), (eh_frame, eh_frame_bytes)))
}

/// The bytes at stated range `r` of a module loaded with bias `bias`.
fn loaded(bias: u64, r: &Range<u64>) -> Option<LoadedBytes> {
    let start = usize::try_from(bias.checked_add(r.start)?).ok()?;
    let len = usize::try_from(r.end.checked_sub(r.start)?).ok()?;
    if start == 0 {
        return None;
    }
    // SAFETY: `r` lies inside a file-backed `PT_LOAD` segment of a loaded module
    // (checked by the callers), mapped readable at bias + its stated address; the
    // module is pinned or never unmapped (`pin`), so the slice stays valid for good.
    Some(LoadedBytes(unsafe {
        std::slice::from_raw_parts(start as *const u8, len)
    }))
}

/// The stated address of `.eh_frame` from its header (`eh_frame_ptr`, DWARF pointer
/// encoding `hdr[1]`), for the encodings linkers write.
fn eh_frame_ptr(hdr: &[u8], hdr_svma: u64) -> Option<u64> {
    const PCREL: u8 = 0x10;
    const DATAREL: u8 = 0x30;
    if hdr.len() < 12 || hdr[0] != 1 {
        return None;
    }
    let enc = hdr[1];
    let field = &hdr[4..];
    let value = match enc & 0x0f {
        0x00 | 0x04 => u64::from_le_bytes(field.get(..8)?.try_into().ok()?),
        0x03 => u64::from(u32::from_le_bytes(field[..4].try_into().ok()?)),
        0x0b => i64::from(i32::from_le_bytes(field[..4].try_into().ok()?)) as u64,
        0x0c => i64::from_le_bytes(field.get(..8)?.try_into().ok()?) as u64,
        _ => return None,
    };
    match enc & 0x70 {
        0 => Some(value),
        PCREL => Some((hdr_svma + 4).wrapping_add(value)),
        DATAREL => Some(hdr_svma.wrapping_add(value)),
        _ => None,
    }
}

/// How a DWARF walk ended.
pub(crate) struct Walk {
    pub(crate) depth: usize,
    /// Stopped at [`MAX_FRAMES`] with frames left.
    pub(crate) truncated: bool,
    /// Reached the thread's first frame (the unwind information says the stack ends
    /// there), rather than stopping at a frame it could not unwind.
    pub(crate) rooted: bool,
    /// Rules looked up (one per frame unwound) and how many missed the cache.
    pub(crate) lookups: u64,
    pub(crate) misses: u64,
}

/// Unwinds the interrupted context into `out` (leaf first) with the call-frame
/// information of `map`, reading the stack only inside `[regs.sp, stack_hi)` (and
/// only the pc when the stack pointer is outside `[stack_lo, stack_hi)`).
///
/// # Safety
/// `[stack_lo, stack_hi)` must be the interrupted thread's stack (mapped), and the
/// handler must run on that thread.
#[inline(always)]
pub(crate) unsafe fn walk(
    map: &ModuleMap,
    regs: &Regs,
    stack_lo: usize,
    stack_hi: usize,
    cache: &mut UnwindCache,
    out: &mut [u64; MAX_FRAMES],
) -> Walk {
    out[0] = regs.pc as u64;
    if regs.sp < stack_lo || regs.sp >= stack_hi {
        // Not on the thread's known stack (alternate stack, coroutine): pc only.
        return Walk {
            depth: 1,
            truncated: false,
            rooted: false,
            lookups: 0,
            misses: 0,
        };
    }
    let (lookups_before, misses_before) = cache.lookups_and_misses();
    let lo = regs.sp as u64;
    let hi = (stack_hi as u64).saturating_sub(8);
    let mut read_stack = |addr: u64| {
        if addr < lo || addr > hi || !addr.is_multiple_of(8) {
            return Err(());
        }
        // SAFETY: `addr` is aligned and inside [sp, stack_hi - 8]: the live, mapped
        // part of the interrupted thread's stack (caller's guarantee).
        Ok(unsafe { *(addr as *const u64) })
    };
    let mut unwind_regs = UnwindRegsX86_64::new(regs.pc as u64, regs.sp as u64, regs.fp as u64);
    let mut walk = Walk {
        depth: 1,
        truncated: false,
        rooted: false,
        lookups: 0,
        misses: 0,
    };
    // framehop's own iterator, frame by frame, so each frame's rule comes from the
    // cache of its address.
    let mut frame = FrameAddress::from_instruction_pointer(regs.pc as u64);
    loop {
        let way = cache.way(frame.address_for_lookup());
        match map
            .unwinder
            .unwind_frame(frame, &mut unwind_regs, way, &mut read_stack)
        {
            Ok(Some(ret)) => {
                let Some(next) = FrameAddress::from_return_address(ret) else {
                    break;
                };
                if walk.depth == MAX_FRAMES {
                    walk.truncated = true;
                    break;
                }
                out[walk.depth] = ret;
                walk.depth += 1;
                frame = next;
            }
            Ok(None) => {
                walk.rooted = true;
                break;
            }
            Err(_) => break,
        }
    }
    if !walk.rooted && !walk.truncated && walk.depth > 0 && !map.covers(out[walk.depth - 1]) {
        // The walk stopped in code no module covers: loaded since the map was read?
        UNKNOWN_CODE.store(true, Ordering::Relaxed);
    }
    let (lookups, misses) = cache.lookups_and_misses();
    walk.lookups = lookups - lookups_before;
    walk.misses = misses - misses_before;
    walk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_and_libc_are_read_with_their_unwind_sections() {
        let modules = pinned_modules();
        let exe = modules
            .iter()
            .find(|m| m.name.is_empty())
            .expect("the executable");
        let libc = modules
            .iter()
            .find(|m| m.name.contains("libc.so"))
            .expect("libc");
        for m in [exe, libc] {
            let hdr = m.eh_frame_hdr.clone().expect("PT_GNU_EH_FRAME");
            let ((_, hdr_bytes), (eh_frame, eh_frame_bytes)) =
                unwind_sections(m, hdr).expect("unwind sections");
            assert_eq!(hdr_bytes[0], 1, "{}: .eh_frame_hdr version", m.name);
            assert!(
                eh_frame.start > 0 && !eh_frame_bytes.is_empty(),
                "{}",
                m.name
            );
            // The first entry of .eh_frame is a CIE: its id (after the length) is 0.
            assert_eq!(
                &eh_frame_bytes[4..8],
                &[0, 0, 0, 0],
                "{}: a CIE first",
                m.name
            );
        }
    }

    #[test]
    fn a_map_covers_the_code_of_its_modules_only() {
        refresh(false);
        let map = current().expect("published");
        let here = a_map_covers_the_code_of_its_modules_only as *const () as u64;
        assert!(map.covers(here));
        assert!(map.covers(libc::malloc as *const () as u64));
        let on_the_heap = Box::new(0u8);
        assert!(!map.covers(&*on_the_heap as *const u8 as u64));
        // Nothing changed: no new map.
        let before = maps_published();
        refresh(false);
        assert_eq!(maps_published(), before);
    }

    #[test]
    fn a_held_cache_is_never_handed_out_again_until_returned() {
        refresh(false);
        let n = POOL.get().expect("the pool").len();
        let held: Vec<HeldCache> = (0..n)
            .map(|i| HeldCache::take(i).expect("a free cache"))
            .collect();
        // Every cache held: a take finds none, and looking must not free any.
        assert!(HeldCache::take(0).is_none());
        assert!(
            HeldCache::take(0).is_none(),
            "a take that found nothing freed a held cache"
        );
        drop(held);
        assert!(HeldCache::take(0).is_some());
    }

    #[test]
    fn pointer_encodings_of_eh_frame_hdr() {
        // pcrel | sdata4, -0x10 from the field at hdr + 4.
        let mut hdr = [1u8, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 0, 0, 0, 0];
        hdr[4..8].copy_from_slice(&(-0x10i32).to_le_bytes());
        assert_eq!(eh_frame_ptr(&hdr, 0x1000), Some(0x1000 + 4 - 0x10));
        // absptr, udata8.
        let mut hdr = [1u8, 0x00, 0x03, 0x3b, 0, 0, 0, 0, 0, 0, 0, 0];
        hdr[4..12].copy_from_slice(&0x4242u64.to_le_bytes());
        assert_eq!(eh_frame_ptr(&hdr, 0x1000), Some(0x4242));
        // A version framehop would not read, and an encoding we do not take.
        assert_eq!(eh_frame_ptr(&[2u8; 12], 0), None);
        assert_eq!(
            eh_frame_ptr(&[1u8, 0x1b | 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0),
            None
        );
    }
}
