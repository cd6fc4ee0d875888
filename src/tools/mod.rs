//! Command-line tools beside the daemon: `doctor`, `probe`, `generate` (and `bench`).

pub mod bench;
pub mod doctor;
pub mod generate;
pub mod probe;
