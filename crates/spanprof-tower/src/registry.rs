//! Labels of live spans by span id, so the span processor can write each span's
//! figures onto it when it ends, or (a batching pipeline,
//! [`crate::SpanProfileProcessor::batch`]) keep the ended span's figures until the
//! exporting thread writes them. Bounded: a fixed table; when every place a span may
//! take is held, the oldest holder goes, counted.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use spanprof_core::scope::current_scope;
use spanprof_core::{Hotness, ProfileScope, SpanLabels};

/// Most spans tracked at once: the places in the table (72 bytes each on Linux, its
/// 64-byte lock and figures and its id, 1.1 MiB in all, allocated when a
/// [`crate::SpanProfileProcessor`] turns tracking on).
pub const MAX_TRACKED_SPANS: usize = PLACES;

/// Places in the table, a power of two.
const PLACES: usize = 1 << 14;

/// The places a span may take: the eight of its bucket (a hash of its id), whose ids
/// share one cache line. A span is found by comparing them, without a lock.
const WINDOW: usize = 8;

/// An ended span's figures, read from its labels on the thread that ended it, so
/// the labels are released there and the request's thread allocates nothing for
/// the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Figures {
    pub busy_ns: u64,
    /// CPU inside the span's polls from the thread's CPU clock when every poll read
    /// it (`cpu_from_clock`), else the sample estimate.
    pub cpu_ns: u64,
    /// Saturating (a span polled four billion times).
    pub polls: u32,
    /// Saturating.
    pub cpu_samples: u32,
    /// The longest poll, µs (µs and saturating at 71 minutes, here and below: the
    /// place is one cache line).
    pub max_poll_us: u32,
    /// Runnable-but-not-polled time, µs.
    pub sched_delay_us: u32,
    /// Time inside the polls the thread was preempted, µs.
    pub preempted_us: u32,
    /// `Sampled` or `Slow` when profiled at the high rate.
    pub hot: Hotness,
    /// Whether the span carries its own profile id (`pyroscope.profile.id`).
    pub own_profile_id: bool,
    pub cpu_from_clock: bool,
    /// Saturating.
    pub long_polls: u8,
}

impl Figures {
    fn of(labels: &SpanLabels) -> Figures {
        let stats = labels.poll_stats();
        Figures {
            busy_ns: stats.busy_ns,
            max_poll_us: micros(stats.max_poll_ns),
            cpu_ns: stats.cpu_clock_ns.unwrap_or_else(|| labels.cpu_ns()),
            polls: u32::try_from(stats.polls).unwrap_or(u32::MAX),
            cpu_samples: u32::try_from(labels.cpu_samples()).unwrap_or(u32::MAX),
            sched_delay_us: micros(stats.sched_delay_ns),
            preempted_us: micros(stats.preempted_ns),
            hot: labels.hotness(),
            own_profile_id: current_scope() == ProfileScope::AllSpans
                || labels.root_span_id() == labels.span_id(),
            cpu_from_clock: stats.cpu_clock_ns.is_some(),
            long_polls: u8::try_from(stats.long_polls).unwrap_or(u8::MAX),
        }
    }
}

/// `ns` in whole µs, saturating.
fn micros(ns: u64) -> u32 {
    u32::try_from(ns / 1_000).unwrap_or(u32::MAX)
}

/// What a place holds.
enum State {
    Empty,
    /// The span is live: its labels.
    Live(SpanLabels),
    /// The span has ended and its figures wait for the exporting thread.
    Ended(Figures),
}

impl State {
    /// The span's figures: read from its labels now if it is live.
    fn figures(&self) -> Option<Figures> {
        match self {
            State::Empty => None,
            State::Live(labels) => Some(Figures::of(labels)),
            State::Ended(figures) => Some(*figures),
        }
    }
}

struct Held {
    /// The export count ([`EXPORTS`]) when the span was tracked or ended: which
    /// holder is oldest, and which ended spans no batch carried.
    epoch: u32,
    state: State,
}

/// The ids of one bucket's places, 0 for an empty place: read without a lock to find
/// a span, written under the place's lock. One cache line: a span is found, and an
/// empty place for it, by reading one line.
#[repr(align(64))]
struct Ids([AtomicU64; WINDOW]);

/// One place's lock and what it holds, alone on its cache line.
#[repr(align(64))]
struct Place(Mutex<Held>);

/// The table: a span is tracked, ended and taken by reading its bucket's ids (one
/// line) and locking the place that holds it (another): the workers and the batch
/// thread wait on each other only when one fills or takes a place in the other's
/// bucket. (The table was 16 locked hash maps: a worker tracking a span waited
/// whenever the batch thread held the lock of a sixteenth of all spans, and the maps'
/// lines moved between the cores at every span: this table took 2.35 % off the CPU of
/// a 50 µs request.)
struct Table {
    /// Places held per bucket: a span of an empty bucket (most: only spans that
    /// received a sample are tracked) is not there, known from one byte.
    held: Box<[AtomicU8]>,
    ids: Box<[Ids]>,
    places: Box<[Place]>,
}

/// One place of the table: its id and its lock.
#[derive(Clone, Copy)]
struct PlaceRef {
    id: &'static AtomicU64,
    held: &'static Mutex<Held>,
}

impl PlaceRef {
    fn lock(&self) -> MutexGuard<'static, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This place, locked, if it holds `span_id`: looked at without the lock, then
    /// checked under it (the span may have been taken in between).
    fn lock_if(&self, span_id: u64) -> Option<MutexGuard<'static, Held>> {
        if self.id.load(Ordering::Relaxed) != span_id {
            return None;
        }
        let held = self.lock();
        (self.id.load(Ordering::Relaxed) == span_id).then_some(held)
    }
}

/// Allocated once, on the thread that turns tracking on, never grown: a buffer grown
/// on the request path put blocks into the malloc arena of whichever worker served
/// the request, and glibc then had the workers wait on their arenas' locks.
static TABLE: LazyLock<Table> = LazyLock::new(|| Table {
    held: (0..PLACES / WINDOW).map(|_| AtomicU8::new(0)).collect(),
    ids: (0..PLACES / WINDOW)
        .map(|_| Ids(std::array::from_fn(|_| AtomicU64::new(0))))
        .collect(),
    places: (0..PLACES)
        .map(|_| {
            Place(Mutex::new(Held {
                epoch: 0,
                state: State::Empty,
            }))
        })
        .collect(),
});

/// Place `i` of the table.
fn place(i: usize) -> PlaceRef {
    let table = &*TABLE;
    PlaceRef {
        id: &table.ids[i / WINDOW].0[i % WINDOW],
        held: &table.places[i].0,
    }
}

/// Every place of the table.
fn all_places() -> impl Iterator<Item = PlaceRef> {
    (0..PLACES).map(place)
}

/// The places of `span_id`, its bucket's, home first: the top bits of a
/// multiplicative hash, so ids spread over the table even from an id generator whose
/// low bits are regular (OpenTelemetry's are random, a user's `IdGenerator` need not
/// be).
fn window(span_id: u64) -> impl Iterator<Item = usize> {
    let home = home(span_id);
    (0..WINDOW).map(move |k| home + k)
}

// The hash's shift below is `64 - log2(buckets)`: at least one bucket bit.
const _: () = assert!(PLACES.is_power_of_two() && WINDOW.is_power_of_two() && PLACES / WINDOW > 1);

/// The first place of `span_id`'s bucket.
fn home(span_id: u64) -> usize {
    let buckets = PLACES / WINDOW;
    (span_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - buckets.trailing_zeros())) as usize
        * WINDOW
}

/// The count of places held in place `i`'s bucket.
fn held_in_bucket_of(i: usize) -> &'static AtomicU8 {
    &TABLE.held[i / WINDOW]
}

/// Whether `span_id`'s bucket holds no span (so neither does it).
#[inline]
fn bucket_empty(span_id: u64) -> bool {
    held_in_bucket_of(home(span_id)).load(Ordering::Acquire) == 0
}

/// The place holding `span_id`, looked up without a lock (it may be taken at once).
fn place_of(span_id: u64) -> Option<usize> {
    if bucket_empty(span_id) {
        return None;
    }
    window(span_id).find(|&i| place(i).id.load(Ordering::Relaxed) == span_id)
}

/// The place holding `span_id`, locked, if any.
fn find(span_id: u64) -> Option<MutexGuard<'static, Held>> {
    if bucket_empty(span_id) {
        return None;
    }
    window(span_id).find_map(|i| place(i).lock_if(span_id))
}

/// Empties every place holding `span_id` (one, but for a span tracked on two threads
/// at once) and returns what the first held.
fn remove(span_id: u64) -> Option<State> {
    if bucket_empty(span_id) {
        return None;
    }
    let mut first = None;
    for place in window(span_id).map(place) {
        if let Some(mut held) = place.lock_if(span_id) {
            place.id.store(0, Ordering::Relaxed);
            held_in_bucket_of(home(span_id)).fetch_sub(1, Ordering::Release);
            let state = std::mem::replace(&mut held.state, State::Empty);
            if matches!(state, State::Live(_)) {
                count_live(span_id, 0);
            }
            #[cfg(test)]
            tests::under_lock();
            drop(held);
            // A second copy's labels are released here, after its lock.
            first.get_or_insert(state);
        }
    }
    first
}

/// The registry's settings and its filter of live tracked spans: one line, read on
/// every request and at every span's end. Nothing on the request path writes it but
/// the tracking of a sampled or hot span (a few in a hundred requests).
#[repr(align(64))]
struct Settings {
    enabled: AtomicBool,
    every_span: AtomicBool,
    /// Live tracked spans by a hash of their id (a count per slot, stuck at 255 once
    /// there): a span's end asks here first, and only a span whose slot counts one
    /// looks in the table, on a line of its bucket (a random line of 1 MiB). Only
    /// spans a sample landed in, or hot ones, are tracked: almost every span ends
    /// with its slot at 0.
    live: [AtomicU8; FILTER_SLOTS],
}

const FILTER_SLOTS: usize = 62;

static SETTINGS: Settings = Settings {
    enabled: AtomicBool::new(false),
    every_span: AtomicBool::new(false),
    live: [const { AtomicU8::new(0) }; FILTER_SLOTS],
};

const _: () = assert!(std::mem::size_of::<Settings>() == 64);

static EVICTED: AtomicU64 = AtomicU64::new(0);

#[inline]
fn live_slot(span_id: u64) -> &'static AtomicU8 {
    &SETTINGS.live[(span_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % FILTER_SLOTS]
}

/// Whether a span of this id may be live and tracked (no: certainly not).
#[inline]
fn maybe_live(span_id: u64) -> bool {
    live_slot(span_id).load(Ordering::Acquire) != 0
}

/// Counts what a place holds now against what it held: `was` and `now` are the ids
/// of live spans (0 for none).
fn count_live(was: u64, now: u64) {
    if now != 0 {
        let _ = live_slot(now).fetch_update(Ordering::Release, Ordering::Relaxed, |n| {
            (n != u8::MAX).then(|| n + 1)
        });
    }
    if was != 0 {
        let _ = live_slot(was).fetch_update(Ordering::Release, Ordering::Relaxed, |n| {
            (n != u8::MAX && n != 0).then(|| n - 1)
        });
    }
}

/// Turns tracking on (a [`crate::SpanProfileProcessor`] exists to consume it), and
/// allocates the table here, on the thread that sets the service up, rather than
/// on the first request's worker. Spans are tracked when the first sample lands in
/// them (the core calls [`track`] then); with [`track_every_span`], at their start.
pub(crate) fn enable() {
    LazyLock::force(&TABLE);
    SETTINGS.enabled.store(true, Ordering::Relaxed);
    spanprof_core::on_first_sample(track);
}

#[inline]
pub(crate) fn enabled() -> bool {
    SETTINGS.enabled.load(Ordering::Relaxed)
}

/// Tracks every sampled trace's span from its start (not only spans that receive a
/// sample): `SpanProfileProcessor::figures_on_every_span`.
pub(crate) fn track_every_span() {
    SETTINGS.every_span.store(true, Ordering::Relaxed);
}

/// Whether a span starting now is tracked at once: every span (see
/// [`track_every_span`]), or hot work (sampled at the high rate anyway). Others are
/// tracked when their first sample lands.
#[inline]
pub(crate) fn track_at_start(hot: Hotness) -> bool {
    hot != Hotness::Cold || SETTINGS.every_span.load(Ordering::Relaxed)
}

/// Builds a span's labels with `build` and hands them to the registry as its figures
/// need: tracked now (hot work, or every span), told to report their first sample
/// (`build`'s argument: the builder's `report_first_sample`), or neither for a span
/// whose trace is not sampled (`otel_sampled`: it has an OpenTelemetry span that will
/// be exported). The one place labels are made for the figures, by the layer and by
/// `SpanProfileLayer`.
#[inline]
pub(crate) fn labelled(
    otel_sampled: bool,
    hot: Hotness,
    build: impl FnOnce(bool) -> SpanLabels,
) -> SpanLabels {
    // Spans no sample lands in need nothing more: the first sample has the core hand
    // the span to the registry (`enable`); hot ones are tracked now (they are
    // sampled at the high rate anyway).
    let tracked = otel_sampled && enabled();
    let at_start = tracked && track_at_start(hot);
    let labels = build(tracked && !at_start);
    if at_start {
        track(&labels);
    }
    labels
}

/// Remembers `labels` under its span id until the span ends: in the first empty
/// place of its bucket, or, every place held by other spans, in the place of the
/// oldest of them, which is dropped and counted.
pub(crate) fn track(labels: &SpanLabels) {
    let id = labels.span_id();
    if !enabled() || id == 0 {
        return;
    }
    let epoch = EXPORTS.load(Ordering::Relaxed);
    // Its own place first (a span tracked again), then the first empty one.
    for place in place_of(id).into_iter().chain(window(id)).map(place) {
        let at = place.id.load(Ordering::Relaxed);
        if at != 0 && at != id {
            continue;
        }
        let held = place.lock();
        let at = place.id.load(Ordering::Relaxed);
        if at == 0 || at == id {
            // A span tracked again: its earlier labels go, after the lock.
            put(place, held, labels, epoch);
            return;
        }
    }
    // Every place is held: the oldest holder goes, by exports since it was tracked
    // or ended (read now, so that no holder is younger than now). Between two
    // exports, and always without `SpanProfileProcessor::batch` (nothing else counts
    // exports), holders are equally old and the bucket's first place goes.
    let now = EXPORTS.load(Ordering::Relaxed);
    let mut oldest = (home(id), 0);
    for i in window(id) {
        let age = now.wrapping_sub(place(i).lock().epoch);
        if age <= u32::MAX / 2 && age > oldest.1 {
            oldest = (i, age);
        }
    }
    let place = place(oldest.0);
    if !matches!(put(place, place.lock(), labels, epoch).state, State::Empty) {
        EVICTED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Puts `labels` in `place` (locked: `held`) and returns what it held, unlocked.
fn put(place: PlaceRef, mut held: MutexGuard<'_, Held>, labels: &SpanLabels, epoch: u32) -> Held {
    let was = place.id.load(Ordering::Relaxed);
    if was == 0 {
        // An empty place is taken: counted before the id is there to find.
        held_in_bucket_of(home(labels.span_id())).fetch_add(1, Ordering::Release);
    }
    // Counted live before its id is there to find, as the bucket's count.
    count_live(
        if matches!(held.state, State::Live(_)) {
            was
        } else {
            0
        },
        labels.span_id(),
    );
    place.id.store(labels.span_id(), Ordering::Relaxed);
    std::mem::replace(
        &mut *held,
        Held {
            epoch,
            state: State::Live(labels.clone()),
        },
    )
}

/// Takes the figures of a live span ending now (the span processor without
/// batching), releasing its labels: nothing, at the cost of one load, for a span
/// that was not tracked.
#[inline]
pub(crate) fn take_live(span_id: u64) -> Option<Figures> {
    if !maybe_live(span_id) {
        return None;
    }
    take(span_id)
}

/// Takes the figures of an ending span, releasing its labels.
pub(crate) fn take(span_id: u64) -> Option<Figures> {
    // What the place held (a live span's labels) is released after its lock.
    remove(span_id)?.figures()
}

/// Exports so far (calls of [`take_many`]): a tracked or ended span is stamped
/// with it.
static EXPORTS: AtomicU32 = AtomicU32::new(0);

/// Ended spans swept because no batch carried them.
static UNEXPORTED: AtomicU64 = AtomicU64::new(0);

/// Exports after which an ended span no batch carried is swept: the batch
/// processor dropped it (its queue was full) or will never export it. With the
/// default queue (2 048 spans, batches of 512) a span waits at most a few exports.
const STALE_AFTER_EXPORTS: u32 = 256;

/// How often, in exports, the sweep runs (it visits every place).
const SWEEP_EVERY: u32 = 64;

/// Takes the figures of the spans `ids` (a batch being exported), in order. Every
/// [`SWEEP_EVERY`] exports, also sweeps ended spans older than
/// [`STALE_AFTER_EXPORTS`] exports.
pub(crate) fn take_many(ids: &[u64]) -> Vec<Option<Figures>> {
    let epoch = EXPORTS.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    touch(ids);
    let out = ids.iter().map(|&id| take(id)).collect();
    if epoch.is_multiple_of(SWEEP_EVERY) {
        sweep(epoch);
    }
    out
}

/// Reads the lines a batch's spans are held in before any is taken: every bucket's
/// ids, then every holding place's lock. The workers wrote them last; read one span
/// at a time, each line is a miss that waits for the one before, read together they
/// are fetched at once (measured: the batch thread's CPU per request −0.15 µs).
fn touch(ids: &[u64]) {
    let mut seen = 0u64;
    for &id in ids {
        seen ^= place(home(id)).id.load(Ordering::Relaxed);
    }
    for &id in ids {
        if let Some(i) = place_of(id) {
            seen ^= u64::from(place(i).held.is_poisoned());
        }
    }
    std::hint::black_box(seen);
}

/// Removes ended spans stamped more than [`STALE_AFTER_EXPORTS`] exports before
/// `epoch`, counted in [`ended_unexported`].
fn sweep(epoch: u32) {
    for (i, place) in all_places().enumerate() {
        if place.id.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let mut held = place.lock();
        if matches!(held.state, State::Ended(_))
            && epoch.wrapping_sub(held.epoch) > STALE_AFTER_EXPORTS
        {
            place.id.store(0, Ordering::Relaxed);
            held_in_bucket_of(i).fetch_sub(1, Ordering::Release);
            held.state = State::Empty;
            UNEXPORTED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Marks a span ended: keeps its figures for [`take`] on the exporting thread and
/// releases its labels here, on the thread that ended it.
#[inline]
pub(crate) fn end(span_id: u64) {
    // Almost every span was never tracked: one load answers.
    if !maybe_live(span_id) {
        return;
    }
    let Some(mut held) = find(span_id) else {
        return;
    };
    let State::Live(labels) = &held.state else {
        return;
    };
    count_live(span_id, 0);
    let figures = Figures::of(labels);
    held.epoch = EXPORTS.load(Ordering::Relaxed);
    let old = std::mem::replace(&mut held.state, State::Ended(figures));
    drop(held);
    drop(old);
}

/// Spans [`crate::SpanProfileProcessor::batch`] saw end whose figures no batch of
/// its exporter carried within 256 exports: the batch processor dropped them (its
/// queue was full; it counts them too) or never exported them. Their attributes
/// were never written; the registry let go of their figures.
pub fn ended_unexported() -> u64 {
    UNEXPORTED.load(Ordering::Relaxed)
}

/// Spans dropped from tracking because too many were held: the table has
/// [`MAX_TRACKED_SPANS`] places and a span may take one of the eight of its bucket
/// (by its id); when all eight hold other spans, the oldest of those goes (oldest in
/// exports of [`crate::SpanProfileProcessor::batch`]; when equally old, the first of
/// the bucket). So a few spans go before the table is full: simulated
/// (`benches/scripts/registry_window.py`), 0.001 % of those tracked with an eighth of the
/// table held (the default batch queue full: 4 spans in 400 000), 0.026 % with a fifth. Held are live
/// spans, and with [`crate::SpanProfileProcessor::batch`] ended spans whose figures
/// wait for the batch processor's thread (those no batch carries are swept, and
/// counted in [`ended_unexported`]).
pub fn tracking_evicted() -> u64 {
    EVICTED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests share the process-wide table: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// Run while a span is taken (by [`take`] or [`take_many`]) under its place's lock.
    type Hook = Box<dyn FnMut() + Send>;
    static UNDER_LOCK: Mutex<Option<Hook>> = Mutex::new(None);

    pub(super) fn under_lock() {
        if let Some(hook) = UNDER_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            hook();
        }
    }

    #[test]
    fn tracking_never_waits_for_a_batch_being_taken() {
        // The batch thread takes the figures of spans that have ended; a worker
        // tracking or ending other spans meanwhile must not wait for it. With one lock
        // for a sixteenth of all spans, it did: a natively measured 4 us of a 50 us
        // handler's request went to the registry.
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let exported = 0x7a5e_0000_0000_0001u64;
        track(&SpanLabels::builder().span_id(exported).build());
        end(exported);
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        *UNDER_LOCK.lock().unwrap() = Some(Box::new(move || {
            held_tx.send(()).ok();
            release_rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .ok();
        }));
        let exporter = std::thread::spawn(move || take_many(&[exported]));
        held_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the export took its lock");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let others: Vec<SpanLabels> = (1..=64)
            .map(|i| SpanLabels::builder().span_id(exported + i).build())
            .collect();
        // A span of the exported span's own bucket may wait for that place, by design:
        // these are all of other buckets.
        assert!(others.iter().all(|l| home(l.span_id()) != home(exported)));
        let worker = std::thread::spawn(move || {
            for l in &others {
                track(l);
                end(l.span_id());
            }
            done_tx.send(()).ok();
            others
        });
        let waited = done_rx
            .recv_timeout(std::time::Duration::from_secs(2))
            .is_err();
        release_tx.send(()).ok();
        let taken = exporter.join().expect("export");
        *UNDER_LOCK.lock().unwrap() = None;
        let others = worker.join().expect("worker");
        assert!(taken[0].is_some());
        assert!(
            !waited,
            "tracking other spans waited for the batch thread's lock"
        );
        let ids: Vec<u64> = others.iter().map(|l| l.span_id()).collect();
        assert!(take_many(&ids).iter().all(Option::is_some));
    }

    /// Spans the table holds.
    fn held() -> usize {
        all_places()
            .filter(|place| place.id.load(Ordering::Relaxed) != 0)
            .count()
    }

    #[test]
    #[cfg(target_os = "linux")] // std's `Mutex` is a 4-byte futex word there
    fn a_place_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Place>(), 64);
        assert_eq!(std::mem::size_of::<Ids>(), 64);
    }

    #[test]
    fn ended_spans_keep_their_figures_for_the_batch_thread_once() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let base = 0xbeef_0000_0000_0000u64;
        let labels: Vec<SpanLabels> = (0..40)
            .map(|i| SpanLabels::builder().span_id(base + i).build())
            .collect();
        for l in &labels {
            track(l);
        }
        // The first half ends on the request's thread; the rest are still live.
        for l in &labels[..20] {
            end(l.span_id());
        }
        // Promoted after it ended, a span's figures do not change: they were read
        // as it ended. A live span's are read when taken.
        for l in &labels {
            l.promote(spanprof_core::Hotness::Slow);
        }
        let mut ids: Vec<u64> = labels.iter().map(|l| l.span_id()).rev().collect();
        ids.push(base + 1000); // never tracked
        let out = take_many(&ids);
        assert_eq!(out.len(), ids.len());
        for (id, figures) in ids.iter().zip(&out) {
            if *id == base + 1000 {
                assert_eq!(*figures, None);
            } else {
                let ended = *id < base + 20;
                let hot = figures.expect("tracked").hot;
                assert_eq!(hot.as_str(), (!ended).then_some("slow"), "span {id:x}");
            }
        }
        // Taken once: a second batch with the same spans finds nothing.
        assert!(take_many(&ids).iter().all(Option::is_none));
        // The registry holds no reference to the labels any more.
        assert!(labels.iter().all(|l| take(l.span_id()).is_none()));
    }

    #[test]
    fn ended_spans_no_batch_carries_are_swept_and_counted() {
        // The batch processor drops spans when its queue is full, after `on_end`
        // kept their figures: no batch ever takes those, and without a sweep they
        // stayed until the table's bound, growing it on the request threads.
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let base = 0xdead_0000_0000_0000u64;
        let dropped = SpanLabels::builder().span_id(base).build();
        let exported = SpanLabels::builder().span_id(base + 1).build();
        track(&dropped);
        track(&exported);
        end(base);
        end(base + 1);
        let unexported = ended_unexported();
        // Batches that carry other spans, as many as a span may wait in a full
        // default queue: nothing is swept yet.
        for _ in 0..8 {
            take_many(&[base + 2]);
        }
        assert_eq!(ended_unexported(), unexported);
        assert!(
            take_many(&[base + 1])[0].is_some(),
            "a span exported late still has its figures"
        );
        for _ in 0..2 * STALE_AFTER_EXPORTS {
            take_many(&[base + 2]);
        }
        assert_eq!(ended_unexported() - unexported, 1);
        assert!(take(base).is_none(), "swept");
    }

    #[test]
    fn tracking_stays_bounded_and_counts_what_it_evicts() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let evicted = tracking_evicted();
        let before = held();
        let n = 2 * MAX_TRACKED_SPANS as u64;
        // Ids of this test's own, all multiples of 16: spread over the table by
        // their hash, not their low bits.
        let base = 0xfeed_0000_0000_0000u64;
        for i in 0..n {
            track(&SpanLabels::builder().span_id(base + 16 * i).build());
        }
        let now = held();
        // Twice the bound fills the table but for a few places.
        assert!(now > MAX_TRACKED_SPANS * 9 / 10, "{now} held");
        // Every span tracked is held or counted.
        assert_eq!(
            (tracking_evicted() - evicted) as usize,
            before + n as usize - now
        );
        // The newest is still there.
        assert!(take(base + 16 * (n - 1)).is_some());
        for i in 0..n {
            take(base + 16 * i);
        }
    }

    /// The first `n` ids after `after` whose home is `place`.
    fn homed_at(place: usize, after: u64, n: usize) -> Vec<u64> {
        (1..)
            .map(|k| after + k)
            .filter(|&id| home(id) == place)
            .take(n)
            .collect()
    }

    #[test]
    fn a_full_window_gives_up_its_oldest_span() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let old = 0x01d0_0000_0000_0001u64;
        // Nine more spans of its bucket: the first keeps the bucket's first place
        // while the old span takes the second, then goes, an export before the
        // others come.
        let mut same = homed_at(home(old), old, WINDOW + 1);
        let first = same.remove(0);
        track(&SpanLabels::builder().span_id(first).build());
        track(&SpanLabels::builder().span_id(old).build());
        assert!(take(first).is_some());
        take_many(&[]); // an export later
        let newest = same.pop().expect("eight");
        for &id in &same {
            track(&SpanLabels::builder().span_id(id).build());
        }
        let evicted = tracking_evicted();
        track(&SpanLabels::builder().span_id(newest).build());
        assert_eq!(tracking_evicted() - evicted, 1);
        assert!(take(old).is_none(), "the oldest went, not the one at home");
        for id in same.into_iter().chain([newest]) {
            assert!(take(id).is_some(), "{id:x} kept");
        }
    }

    #[test]
    fn a_span_tracked_again_is_held_once() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let span = 0x0a9a_0000_0000_0001u64;
        // Two spans at its home and the next place: it goes third.
        let before = homed_at(home(span), span, 2);
        for &id in &before {
            track(&SpanLabels::builder().span_id(id).build());
        }
        track(&SpanLabels::builder().span_id(span).build());
        // Its home empties; tracked again, it stays where it is.
        assert!(take(before[0]).is_some());
        track(&SpanLabels::builder().span_id(span).build());
        let copies = all_places()
            .filter(|place| place.id.load(Ordering::Relaxed) == span)
            .count();
        assert_eq!(copies, 1);
        assert!(take(span).is_some());
        assert!(take(before[1]).is_some());
    }

    #[test]
    fn id_zero_is_never_tracked() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        track(&SpanLabels::builder().span_id(0).build());
        assert!(take(0).is_none());
    }
}
