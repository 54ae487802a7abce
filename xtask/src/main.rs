//! Project automation (under construction).
fn main() {}
