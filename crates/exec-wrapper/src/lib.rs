//! exec-wrapper (under construction).
#![deny(missing_docs)]
