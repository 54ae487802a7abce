//! sandbox-core
#![deny(missing_docs)]
