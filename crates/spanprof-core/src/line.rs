//! [`OwnLine`]: a static alone on its cache line.
//!
//! The linker packs a crate's statics together, so a setting read on every request
//! can share its line with a counter some thread writes, and every write then costs
//! each reader a miss. Statics read on the request path are wrapped in this.

use std::ops::Deref;

/// `T`, aligned to (and so alone on) a 64-byte cache line.
#[repr(align(64))]
#[derive(Debug)]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> Deref for OwnLine<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}
