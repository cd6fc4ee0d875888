//! Command-line tools beside the daemon: `doctor`, `probe` (and `generate`, `bench`).

pub mod doctor;
pub mod probe;
