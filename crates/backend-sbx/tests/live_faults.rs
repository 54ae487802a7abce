//! One test per simulator fault switch: each proves the typed error and that nothing another
//! process owns was deleted.

mod support;
