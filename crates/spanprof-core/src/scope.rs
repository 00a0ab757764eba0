//! [`ProfileScope`]: which spans carry their own profile id, one setting for the
//! request layer, the span processor and the sinks.

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
