//! Live tests (written next).
