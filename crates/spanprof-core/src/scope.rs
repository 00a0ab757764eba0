//! [`ProfileScope`]: which spans carry their own profile id, and the process's one
//! setting of it, read by the request layer, the span processor and the sinks.
//!
//! A service sets it through `spanprof-tower`'s layer builder (`.scope(..)`, or the
//! policy file's `scope`); the sinks (`spanprof-export`'s `ProfileSource::profiler`)
//! read it for every profile they build, so the `pyroscope.profile.id` on spans and
//! the `span_id` label of samples always agree.

use std::sync::atomic::{AtomicU8, Ordering};

/// Which spans carry their own profile id (the `span_id` label of samples,
/// `pyroscope.profile.id` on spans).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProfileScope {
    /// The local root span of each service (no parent, or a remote parent), Grafana's
    /// convention: inner spans' samples are attributed to their local root.
    #[default]
    LocalRoot,
    /// Every span: inner spans (through spanprof's tracing layer) get their own.
    AllSpans,
}

/// Nothing set yet: [`ProfileScope::LocalRoot`], the default.
const UNSET: u8 = 0;
const LOCAL_ROOT: u8 = 1;
const ALL_SPANS: u8 = 2;

/// The process's scope: [`UNSET`] or the last one set.
static SCOPE: AtomicU8 = AtomicU8::new(UNSET);

fn encode(scope: ProfileScope) -> u8 {
    match scope {
        ProfileScope::LocalRoot => LOCAL_ROOT,
        ProfileScope::AllSpans => ALL_SPANS,
    }
}

fn decode(v: u8) -> Option<ProfileScope> {
    match v {
        LOCAL_ROOT => Some(ProfileScope::LocalRoot),
        ALL_SPANS => Some(ProfileScope::AllSpans),
        _ => None,
    }
}

/// Sets the process's scope and returns the one set before, if one was. The layer
/// builder calls it when a scope is configured (so two layers that disagree can be
/// told apart from one that leaves the default); services set the scope there, not
/// here.
pub fn set_scope(scope: ProfileScope) -> Option<ProfileScope> {
    decode(SCOPE.swap(encode(scope), Ordering::Relaxed))
}

/// The scope in force: the last one set, or [`ProfileScope::LocalRoot`].
#[inline]
pub fn current_scope() -> ProfileScope {
    decode(SCOPE.load(Ordering::Relaxed)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_is_local_root_until_set_and_then_the_last_one_set() {
        // One test owns the process-wide setting in this crate's unit tests.
        assert_eq!(current_scope(), ProfileScope::LocalRoot);
        assert_eq!(set_scope(ProfileScope::AllSpans), None);
        assert_eq!(current_scope(), ProfileScope::AllSpans);
        assert_eq!(
            set_scope(ProfileScope::LocalRoot),
            Some(ProfileScope::AllSpans)
        );
        assert_eq!(current_scope(), ProfileScope::LocalRoot);
    }
}
