//! confined-fs (under construction).
#![deny(missing_docs)]
