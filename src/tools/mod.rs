//! Command implementations that are tools rather than the daemon: `bench` (and `probe`).

pub mod bench;
