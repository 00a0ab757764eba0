//! [`ProfileSource`]: where each interval's profile comes from.

use spanprof_core::scope::current_scope;
use spanprof_core::{Profile, ProfileScope, Profiler};

/// Where an exporter gets each interval's profile.
pub struct ProfileSource(Box<dyn FnMut(bool) -> Profile + Send>);

impl std::fmt::Debug for ProfileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProfileSource")
    }
}

impl ProfileSource {
    /// Everything the profiler samples from now on, one interval at a time, with span
    /// ids in the process's [`ProfileScope`], the one the layer was built with (read
    /// for each profile: [`spanprof_core::scope::current_scope`]):
    /// [`ProfileScope::LocalRoot`] (the default, Grafana's convention: inner spans'
    /// samples carry their local root's id) or [`ProfileScope::AllSpans`] (each
    /// span's own). Each interval first drains the profiler's per-thread buffers
    /// ([`Profiler::flush`]), so that every sample taken before it — the last ones
    /// of a request that ended just before shutdown, too — is in it.
    ///
    /// Samples carry their request's latency class (`span_latency`): those of a
    /// request still running at the end of an interval wait for the next one
    /// ([`spanprof_core::ProfileWindow::take`]); the last interval, at shutdown,
    /// holds nothing back.
    pub fn profiler(profiler: &Profiler) -> Self {
        let window = profiler.window(spanprof_core::DEFAULT_WINDOW_ENTRIES);
        let profiler = profiler.clone();
        ProfileSource(Box::new(move |last| {
            profiler.flush();
            let p = if last {
                window.take_all()
            } else {
                window.take()
            };
            match current_scope() {
                ProfileScope::AllSpans => p,
                ProfileScope::LocalRoot => p.with_local_root_ids(),
            }
        }))
    }

    /// Any function returning the next interval's profile.
    pub fn from_fn(mut f: impl FnMut() -> Profile + Send + 'static) -> Self {
        ProfileSource(Box::new(move |_| f()))
    }

    /// The next interval's profile; `last`: the sink is shutting down.
    pub(crate) fn next(&mut self, last: bool) -> Profile {
        (self.0)(last)
    }
}
