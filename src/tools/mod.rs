//! Command implementations that are tools rather than the daemon: `probe` (and `bench`).

pub mod probe;
