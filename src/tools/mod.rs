//! Command-line tools beside the daemon: `doctor`, `probe`, `generate` (and `bench`).

pub mod bench;
pub mod bench_synthetic;
pub mod doctor;
pub mod generate;
pub mod probe;
