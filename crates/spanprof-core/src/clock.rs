//! The clock of poll accounting and wake stamps.

use std::sync::LazyLock;

use crate::line::OwnLine;

/// The clock of poll accounting: the TSC through quanta (a few ns a read, where
/// `Instant::now()` costs ~23 ns on these machines).
pub(crate) static CLOCK: OwnLine<LazyLock<quanta::Clock>> =
    OwnLine(LazyLock::new(quanta::Clock::new));
