//! Symbolization off the hot path: instruction addresses to demangled function
//! names with inlined frames, source files and lines (blazesym), cached per address
//! and per name in caches bounded by bytes.

use crate::cache::FastMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::Pid;
use blazesym::symbolize::cache::{self, Cache};
use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::cache::{BoundedCache, CacheStats};
use crate::profile::{Frame, OVERFLOW_ADDR, TRUNCATED_ADDR};

/// Names of functions and files shared by the frames of the address cache.
type Names = BoundedCache<Arc<str>, Arc<str>>;

/// Least time between two reads of the process's mappings prompted by addresses
/// outside every mapping known: code mapped since (a library loaded with `dlopen`)
/// is found within this time, and a stream of stray addresses (a frame-pointer walk
/// through code built without them) cannot make every batch read the mappings again.
const REMAP_INTERVAL: Duration = Duration::from_secs(1);

/// Bytes of one cached address: its frames, in one shared allocation.
fn frames_bytes(frames: &[Frame]) -> usize {
    2 * std::mem::size_of::<usize>() + std::mem::size_of_val(frames)
}

pub(crate) struct AddressSymbolizer {
    symbolizer: Symbolizer,
    /// Frames per instruction address (bounded: three quarters of the bound).
    cache: BoundedCache<u64, Arc<[Frame]>>,
    /// Function and file names, so frames share them (a quarter of the bound).
    names: Names,
    /// Executable mappings of this process (start, end, file name) as last read,
    /// the same moment blazesym's copy of them was taken: to tell code mapped since
    /// from code already known, and to name addresses no symbol covers
    /// (`[libc.so.6]`).
    modules: Vec<(u64, u64, String)>,
    /// When an address outside every known mapping last made them be read again.
    remapped_at: Option<Instant>,
    /// Calls into blazesym so far (each walks the symbol tables of the files it
    /// touches).
    pub(crate) calls: u64,
    /// Reads of the process's mappings so far (`/proc/self/maps`, for `modules` and
    /// for blazesym's copy); none yet until the first call.
    pub(crate) map_reads: u64,
    /// Addresses named so far by their hex value only because the mappings could
    /// not be read again yet (not cached): a stack holding one must not be kept
    /// either.
    pub(crate) provisional: u64,
}

/// Executable file mappings of this process from `/proc/self/maps`: (start, end,
/// path).
fn read_modules() -> Vec<(u64, u64, String)> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|l| {
            // address perms offset dev inode, then the path: the rest of the line,
            // spaces and all.
            let mut rest = l;
            let mut fields = [""; 5];
            for field in &mut fields {
                rest = rest.trim_start();
                let end = rest.find(char::is_whitespace)?;
                *field = &rest[..end];
                rest = &rest[end..];
            }
            let [range, perms, ..] = fields;
            let path = rest.trim();
            if path.is_empty() {
                return None;
            }
            if !perms.contains('x') {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                path.to_owned(),
            ))
        })
        .collect()
}

/// The address range of the main executable's code (built with frame pointers),
/// for the unwinder's leaf-caller recovery: its largest executable mapping, one
/// contiguous mapped range (the signal handler reads code bytes inside it). `None`
/// when it cannot be read.
pub(crate) fn executable_text() -> Option<(u64, u64)> {
    let exe = std::fs::read_link("/proc/self/exe").ok()?;
    let exe = exe.to_str()?;
    read_modules()
        .into_iter()
        .filter(|(_, _, path)| path == exe)
        .map(|(a, b, _)| (a, b))
        .max_by_key(|&(a, b)| b - a)
}

/// The mapped file whose code holds `addr`, if any.
fn module_of(modules: &[(u64, u64, String)], addr: u64) -> Option<&str> {
    modules
        .iter()
        .find(|(a, b, _)| (*a..*b).contains(&addr))
        .map(|(_, _, path)| path.as_str())
}

/// `[module]` for an address in the mapped file `module`, else its hex address.
fn unknown_name(module: Option<&str>, addr: u64) -> String {
    match module {
        Some(path) => format!("[{}]", path.rsplit('/').next().unwrap_or(path)),
        None => format!("0x{addr:x}"),
    }
}

impl AddressSymbolizer {
    /// A symbolizer whose own caches hold at most about `max_bytes`.
    pub(crate) fn new(max_bytes: usize) -> Self {
        AddressSymbolizer {
            // No auto-reload: blazesym would `stat` every file it uses on every
            // call to see whether it changed on disk. The files are the process's
            // own mappings (`/proc/self/map_files`), whose code does not change
            // while mapped; the addresses' frames are cached for good anyway.
            symbolizer: Symbolizer::builder()
                .enable_inlined_fns(true)
                .enable_code_info(true)
                .enable_demangling(true)
                .enable_auto_reload(false)
                .build(),
            cache: BoundedCache::new(max_bytes / 4 * 3),
            names: BoundedCache::new(max_bytes / 4),
            modules: Vec::new(),
            remapped_at: None,
            calls: 0,
            map_reads: 0,
            provisional: 0,
        }
    }

    /// Reads the process's mappings, for `modules` and for blazesym (which
    /// otherwise reads `/proc/self/maps` on every call, a third of the collector's
    /// CPU in steady state): on the first call, and again when an address of
    /// `missing` lies outside every mapping known, at most once per
    /// [`REMAP_INTERVAL`]. Returns whether the mappings are current for `missing`:
    /// read now, or covering every address of it.
    fn sync_mappings(&mut self, missing: &[u64]) -> bool {
        if self.map_reads > 0 {
            if missing
                .iter()
                .all(|&a| module_of(&self.modules, a).is_some())
            {
                return true;
            }
            let now = Instant::now();
            if self
                .remapped_at
                .is_some_and(|at| now.duration_since(at) < REMAP_INTERVAL)
            {
                return false;
            }
            self.remapped_at = Some(now);
        }
        self.modules = read_modules();
        self.map_reads += 1;
        let vmas = Cache::Process(cache::Process::new(Pid::Slf));
        if let Err(e) = self.symbolizer.cache(&vmas) {
            // Without its own copy blazesym reads the mappings on each call: slower,
            // still right.
            tracing::debug!(error = %e, "spanprof: caching the process's mappings failed");
        }
        true
    }

    /// The counters of its caches (addresses and names together).
    pub(crate) fn stats(&self) -> CacheStats {
        let mut s = self.cache.stats();
        s.add(self.names.stats());
        s
    }

    /// Symbolizes, in one call, every address of `stacks` not cached yet (the
    /// collector hands it a batch's new stacks), so that a batch costs one read of
    /// `/proc/self/maps` and one pass over the symbol tables instead of one per stack.
    pub(crate) fn prefetch<'a>(&mut self, stacks: impl IntoIterator<Item = &'a [u64]>) {
        let mut missing = Vec::new();
        for addrs in stacks {
            for (i, &a) in addrs.iter().enumerate() {
                let l = lookup_addr(i, a);
                if !self.is_known(l) {
                    missing.push(l);
                }
            }
        }
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            self.symbolize_into(&missing, &mut FastMap::default());
        }
    }

    /// The frames of a raw stack (leaf first). Return addresses (every frame but the
    /// first) are looked up at `addr - 1`, inside the call instruction.
    ///
    /// The frames are copied out of the cache by reference: a stack of cached
    /// addresses touches each address's frames once, not its reference count too
    /// (a cold line per address on a busy collector). The cache is only read while
    /// the stack is built, and its addresses are marked used after: marking one
    /// can turn the cache over, which would drop others of the stack before they
    /// were read.
    pub(crate) fn stack(&mut self, addrs: &[u64]) -> Arc<[Frame]> {
        let lookups: Vec<u64> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| lookup_addr(i, a))
            .collect();
        for &l in &lookups {
            self.keep_sentinel(l);
        }
        let mut missing: Vec<u64> = lookups
            .iter()
            .copied()
            .filter(|l| self.cache.peek(l).is_none())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        // What this call named, provisional names (not cached) among them.
        let mut found = FastMap::default();
        if !missing.is_empty() {
            self.symbolize_into(&missing, &mut found);
            self.keep_known_frames(&lookups, &mut found);
        }
        let groups: Vec<(u64, &Arc<[Frame]>)> = addrs
            .iter()
            .zip(&lookups)
            .filter_map(|(&a, l)| Some((a, found.get(l).or_else(|| self.cache.peek(l))?)))
            .collect();
        // Each frame's clone below is a locked increment of its names' reference
        // counts, and a locked instruction waits for every load before it: one cache
        // miss after another, a stack's worth. Reading the names' lines first, with
        // plain loads, lets the misses overlap; the increments then find them cached.
        let mut touched = 0u8;
        for f in groups.iter().flat_map(|(_, frames)| frames.iter()) {
            touched = touched
                .wrapping_add(f.function.as_bytes().first().copied().unwrap_or(0))
                .wrapping_add(
                    f.file
                        .as_deref()
                        .map_or(0, |s| s.as_bytes().first().copied().unwrap_or(0)),
                );
        }
        std::hint::black_box(touched);
        let mut out = Vec::with_capacity(addrs.len() + 4);
        for (a, frames) in groups {
            out.extend(frames.iter().map(|f| Frame {
                address: a,
                ..f.clone()
            }));
        }
        for l in &lookups {
            let _ = self.cache.get(l);
        }
        out.into()
    }

    /// Naming a stack's new addresses can turn the cache over and evict its known
    /// ones (a cache smaller than the stacks it sees): then every address's frames
    /// are held in `found` for this stack, and the evicted ones named again.
    fn keep_known_frames(&mut self, lookups: &[u64], found: &mut FastMap<u64, Arc<[Frame]>>) {
        // The common case, nothing evicted: no frames are taken into `found`.
        if lookups
            .iter()
            .all(|l| found.contains_key(l) || self.cache.peek(l).is_some())
        {
            return;
        }
        let mut lost = Vec::new();
        for &l in lookups {
            if found.contains_key(&l) {
                continue;
            }
            match self.cache.peek(&l).cloned().or_else(|| self.sentinel(l)) {
                Some(frames) => {
                    found.insert(l, frames);
                }
                None => lost.push(l),
            }
        }
        lost.sort_unstable();
        lost.dedup();
        if !lost.is_empty() {
            self.symbolize_into(&lost, found);
        }
    }

    /// Whether `addr` needs no symbolizing: cached, or a sentinel address.
    fn is_known(&self, addr: u64) -> bool {
        self.cache.peek(&addr).is_some() || matches!(addr, TRUNCATED_ADDR | OVERFLOW_ADDR)
    }

    /// The frames of a sentinel address (a truncated stack, a dropped one); `None`
    /// for any other address.
    fn sentinel(&mut self, addr: u64) -> Option<Arc<[Frame]>> {
        let name = match addr {
            TRUNCATED_ADDR => "[truncated: stack deeper than the unwind limit]",
            OVERFLOW_ADDR => "[dropped: stack table full]",
            _ => return None,
        };
        Some(synthetic(&mut self.names, name, addr))
    }

    /// Caches a sentinel address's frames at its first use.
    fn keep_sentinel(&mut self, addr: u64) {
        if self.cache.peek(&addr).is_none()
            && let Some(f) = self.sentinel(addr)
        {
            self.keep(addr, f);
        }
    }

    /// Symbolizes `missing` (sorted, distinct) with blazesym, caching each result;
    /// addresses it cannot name get their module's name.
    fn symbolize_into(&mut self, missing: &[u64], found: &mut FastMap<u64, Arc<[Frame]>>) {
        let current = self.sync_mappings(missing);
        let src = Source::Process(Process::new(Pid::Slf));
        self.calls += 1;
        match self.symbolizer.symbolize(&src, Input::AbsAddr(missing)) {
            Ok(results) => {
                for (&addr, sym) in missing.iter().zip(results) {
                    let frames = match sym {
                        Symbolized::Sym(sym) => sym_frames(&mut self.names, &sym, addr),
                        Symbolized::Unknown(_) => {
                            let module = module_of(&self.modules, addr);
                            let f = synthetic(&mut self.names, &unknown_name(module, addr), addr);
                            if !current && module.is_none() {
                                // Perhaps code mapped since the last read of the
                                // mappings: named by its address this time, asked
                                // again once the mappings can be read again.
                                self.provisional += 1;
                                found.insert(addr, f);
                                continue;
                            }
                            f
                        }
                    };
                    let bytes = frames_bytes(&frames);
                    self.cache.insert(addr, frames.clone(), bytes);
                    found.insert(addr, frames);
                }
            }
            Err(e) if missing.len() > 1 => {
                // One bad address fails the whole batch: retry them one by one.
                tracing::debug!(error = %e, "spanprof: batch symbolization failed; retrying singly");
                for &addr in missing {
                    self.symbolize_into(&[addr], found);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "spanprof: symbolization failed");
                for &addr in missing {
                    let n = unknown_name(module_of(&self.modules, addr), addr);
                    let f = synthetic(&mut self.names, &n, addr);
                    self.keep(addr, f.clone());
                    found.insert(addr, f);
                }
            }
        }
    }

    fn keep(&mut self, addr: u64, frames: Arc<[Frame]>) {
        let bytes = frames_bytes(&frames);
        self.cache.insert(addr, frames, bytes);
    }
}

/// The frames of one symbolized address, innermost first: the deepest inlined
/// callee, ..., then the function that physically contains the address. Each frame
/// carries the line executing in its own function (pprof's convention for the
/// `Line`s of one `Location`): blazesym already gives each inlined function the line
/// of the call it makes into the next one (the innermost, the line at the address)
/// and the physical function the line of its call into the outermost inlined one.
fn sym_frames(names: &mut Names, sym: &blazesym::symbolize::Sym<'_>, addr: u64) -> Arc<[Frame]> {
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    let location = |names: &mut Names, code: Option<&blazesym::symbolize::CodeInfo<'_>>| {
        code.map_or((None, 0), |c| {
            let file = c.file.to_string_lossy();
            (
                (!file.is_empty()).then(|| name(names, &file)),
                c.line.unwrap_or(0),
            )
        })
    };
    for inl in sym.inlined.iter().rev() {
        let (file, line) = location(names, inl.code_info.as_ref());
        frames.push(Frame {
            function: name(names, &clean(&inl.name)),
            file,
            line,
            address: addr,
            inlined: true,
        });
    }
    let (file, line) = location(names, sym.code_info.as_deref());
    frames.push(Frame {
        function: name(names, &clean(&sym.name)),
        file,
        line,
        address: addr,
        inlined: false,
    });
    frames.into()
}

/// The shared copy of a function or file name.
fn name(names: &mut Names, s: &str) -> Arc<str> {
    if let Some(a) = names.get(s) {
        return a.clone();
    }
    let a: Arc<str> = Arc::from(s);
    names.insert(
        a.clone(),
        a.clone(),
        2 * std::mem::size_of::<usize>() + s.len(),
    );
    a
}

fn synthetic(names: &mut Names, function: &str, addr: u64) -> Arc<[Frame]> {
    Arc::from(vec![Frame {
        function: name(names, function),
        file: None,
        line: 0,
        address: addr,
        inlined: false,
    }])
}

fn lookup_addr(index: usize, addr: u64) -> u64 {
    if index == 0 || addr >= OVERFLOW_ADDR {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

/// Strips a trailing Rust symbol hash (`::h0123456789abcdef`).
fn clean(name: &str) -> String {
    if let Some(pos) = name.rfind("::h") {
        let hash = &name[pos + 3..];
        if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return name[..pos].to_owned();
        }
    }
    name.to_owned()
}

/// What the collector pays to name a stack whose addresses are all known (a new
/// stack of code seen before, the steady state): `stacks` stacks `depth` addresses
/// deep in this binary's code (64 places around this function, about 4 KiB apart, so
/// that a stack's frames carry as many different names as a service's do; 48 leaves,
/// callers shared), named once to fill the cache and then timed, each after the CPU
/// caches were evicted. Returns µs per stack (the median of `rounds`). For
/// `rate_sweep --symbolize`.
#[cfg(feature = "testing")]
pub fn warm_stack_cost(stacks: usize, depth: usize, rounds: usize) -> f64 {
    let here = (warm_stack_cost as fn(usize, usize, usize) -> f64) as usize as u64;
    let code: Vec<u64> = (0..64u64)
        .map(|k| (here + k * 4093).saturating_sub(32 * 4093))
        .collect();
    let all: Vec<Vec<u64>> = (0..stacks)
        .map(|s| {
            (0..depth)
                .map(|d| {
                    let base = code[(s + d) % code.len()];
                    // The leaf differs per stack; its callers repeat.
                    let offset = if d == 0 {
                        (s % 48) as u64
                    } else {
                        1 + d as u64
                    };
                    base + offset
                })
                .collect()
        })
        .collect();
    let mut symbolizer = AddressSymbolizer::new(64 << 20);
    for stack in &all {
        std::hint::black_box(symbolizer.stack(stack));
    }
    // Between two batches the service's threads run on the collector's core: each
    // stack is named with the caches evicted, as the collector meets them.
    let mut evict = vec![0u8; 16 << 20];
    let mut times: Vec<f64> = (0..rounds.max(1))
        .map(|round| {
            let mut spent = std::time::Duration::ZERO;
            for stack in &all {
                for b in evict.iter_mut().step_by(64) {
                    *b = b.wrapping_add(round as u8);
                }
                std::hint::black_box(&evict);
                let start = std::time::Instant::now();
                std::hint::black_box(symbolizer.stack(stack));
                spent += start.elapsed();
            }
            spent.as_secs_f64() * 1e6 / stacks.max(1) as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolizer() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn resolves_own_function() {
        let addr = marker_function_for_symbolizer as *const () as u64;
        let mut s = AddressSymbolizer::new(16 << 20);
        let frames = s.stack(&[addr]);
        // The full path, from the workspace's test profile (`debug = "limited"`).
        assert!(
            frames.iter().any(|f| &*f.function
                == "spanprof_core::symbolize::tests::marker_function_for_symbolizer"),
            "{frames:?}"
        );
        assert_eq!(clean("a::b::h0123456789abcdef"), "a::b");
        assert_eq!(clean("a::b::hello"), "a::b::hello");
    }

    #[test]
    fn a_batch_of_new_stacks_is_symbolized_in_one_call() {
        let (lo, hi) = executable_text().expect("this test binary's code");
        let addrs: Vec<u64> = (lo..hi).step_by(4096).take(30).collect();
        let stacks: Vec<&[u64]> = addrs.chunks(3).collect();
        let mut s = AddressSymbolizer::new(16 << 20);
        s.prefetch(stacks.iter().copied());
        for stack in &stacks {
            assert!(s.stack(stack).len() >= stack.len());
        }
        assert_eq!(s.calls, 1, "ten new stacks, one call into blazesym");
        // Stacks already cached cost no call at all.
        s.prefetch(stacks.iter().copied());
        assert_eq!(s.calls, 1);
    }

    /// Read system calls made by the calling thread so far (`syscr` of
    /// `/proc/thread-self/io`).
    fn reads_by_this_thread() -> u64 {
        // One read call of a fixed buffer (the file is far smaller): `read_to_string`
        // makes a number of calls that depends on the text's length, which changes
        // as the counters gain digits, and that made the count of its own reads vary.
        use std::io::Read;
        let mut buf = [0u8; 4096];
        let n = std::fs::File::open("/proc/thread-self/io")
            .and_then(|mut f| f.read(&mut buf))
            .expect("thread io counters");
        let io = std::str::from_utf8(&buf[..n]).expect("utf-8");
        io.lines()
            .find_map(|l| l.strip_prefix("syscr: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("syscr in /proc/thread-self/io")
    }

    #[test]
    fn new_addresses_in_known_code_cost_no_read_of_the_memory_map() {
        // In steady state the collector symbolizes a few new addresses every batch.
        // Reading /proc/self/maps for each of those calls (hundreds of lines, a
        // dozen read calls) was a third of the collector's CPU; the mappings of
        // code already seen do not change, so a call for new addresses in it must
        // not read anything.
        let (lo, hi) = executable_text().expect("this test binary's code");
        let mut s = AddressSymbolizer::new(16 << 20);
        s.prefetch([&[lo + 64][..]]);
        let calls = 10;
        // The reads of the counter itself, measured the same way.
        let before = reads_by_this_thread();
        let own = reads_by_this_thread() - before;
        let before = reads_by_this_thread();
        for k in 0..calls {
            let addrs: Vec<u64> = (0..5)
                .map(|i| lo + 4096 * (1 + k * 5 + i))
                .filter(|&a| a < hi)
                .collect();
            s.prefetch([&addrs[..]]);
        }
        let reads = reads_by_this_thread() - before - own;
        assert_eq!(s.calls, 1 + calls, "one blazesym call a batch");
        assert_eq!(
            reads, 0,
            "{calls} batches of new addresses in known code made {reads} read calls"
        );
        assert_eq!(s.map_reads, 1, "the mappings were read once, at the start");
    }

    #[test]
    fn stray_addresses_read_the_mappings_at_most_once_per_interval() {
        let (lo, _) = executable_text().expect("this test binary's code");
        let mut s = AddressSymbolizer::new(16 << 20);
        s.prefetch([&[lo + 64][..]]);
        assert_eq!(s.map_reads, 1);
        // Never mapped: what a frame-pointer walk through code built without frame
        // pointers can leave in a stack.
        let frames = s.stack(&[0x10]);
        assert_eq!(&*frames[0].function, "0x10");
        assert_eq!(
            s.map_reads, 2,
            "an address outside every mapping reads them again"
        );
        for stray in [0x20, 0x30, 0x10] {
            s.stack(&[stray]);
        }
        assert_eq!(s.map_reads, 2, "not again within {REMAP_INTERVAL:?}");
        // Within the interval they are not cached under their hex names (they may
        // be code mapped since): each is asked again.
        let calls = s.calls;
        s.stack(&[0x20]);
        assert_eq!(s.calls, calls + 1);
    }

    #[test]
    fn code_mapped_after_the_first_call_is_still_named() {
        let (lo, _) = executable_text().expect("this test binary's code");
        let mut s = AddressSymbolizer::new(16 << 20);
        s.prefetch([&[lo + 64][..]]);
        // A library mapped after the first call stands for code the symbolizer has
        // not seen (a plugin loaded with dlopen). liblzma: on every Debian system
        // (dpkg needs it), and nothing in this test binary links it.
        let mapped = |p: &str| {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .contains(p)
        };
        assert!(
            !mapped("liblzma.so"),
            "liblzma not mapped before the test maps it"
        );
        let addr = crate::sys::dlopen_symbol(c"liblzma.so.5", c"lzma_version_string")
            .expect("liblzma's lzma_version_string");
        let frames = s.stack(&[addr]);
        assert!(
            frames.iter().any(|f| &*f.function == "lzma_version_string"),
            "an address in code mapped after the first call: {frames:?}"
        );
    }

    #[test]
    fn the_address_cache_stays_within_its_bound_and_counts_evictions() {
        const MAX: usize = 256 << 10;
        let (lo, hi) = executable_text().expect("this test binary's code");
        let mut s = AddressSymbolizer::new(MAX);
        let mut asked = 0;
        for chunk in (lo..hi)
            .step_by(64)
            .take(20_000)
            .collect::<Vec<_>>()
            .chunks(100)
        {
            assert!(s.stack(chunk).len() >= chunk.len());
            asked += chunk.len();
            let st = s.stats();
            assert!(st.bytes <= st.max_bytes, "after {asked} addresses: {st:?}");
        }
        let st = s.stats();
        assert!(st.evicted > 0, "{st:?}");
    }

    #[test]
    fn a_stack_keeps_its_known_frames_when_naming_its_new_ones_turns_the_cache_over() {
        let (lo, hi) = executable_text().expect("this test binary's code");
        let addrs: Vec<u64> = (lo..hi).step_by(64).take(3_000).collect();
        let mut s = AddressSymbolizer::new(64 << 10);
        let known = &addrs[..20];
        assert!(s.stack(known).len() >= known.len());
        // The known addresses first, then enough new ones to fill the cache twice
        // over while they are named.
        let stack: Vec<u64> = known.iter().chain(&addrs[20..]).copied().collect();
        let frames = s.stack(&stack);
        assert_a_frame_each(&frames, &stack, &s, "one call");
    }

    /// Asserts that `frames` hold a frame of each of `addrs`.
    fn assert_a_frame_each(frames: &[Frame], addrs: &[u64], s: &AddressSymbolizer, when: &str) {
        for (i, &a) in addrs.iter().enumerate() {
            assert!(
                frames.iter().any(|f| f.address == a),
                "{when}: no frame for address {i} of {} ({a:#x}); {:?}",
                addrs.len(),
                s.stats()
            );
        }
    }

    #[test]
    fn a_stack_of_known_addresses_keeps_its_frames_while_the_cache_turns_over() {
        let (lo, hi) = executable_text().expect("this test binary's code");
        let addrs: Vec<u64> = (lo..hi).step_by(64).take(30_000).collect();
        let mut s = AddressSymbolizer::new(64 << 10);
        let known = &addrs[..30];
        // More new addresses between namings of the same stack each time: at some
        // point the cache turns over (the stack's addresses move to its older half)
        // and then fills almost to the next turn, so that moving the stack's
        // addresses up as it is named turns it over again.
        let mut fresh = addrs[30..].iter();
        for k in (150..450).step_by(3) {
            for &a in fresh.by_ref().take(k) {
                s.stack(&[a]);
            }
            let frames = s.stack(known);
            assert_a_frame_each(&frames, known, &s, &format!("after {k} new addresses"));
        }
    }
}
