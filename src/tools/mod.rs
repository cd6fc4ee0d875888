//! Command-line tools beside the daemon: `doctor` (and `probe`, `generate`, `bench`).

pub mod doctor;
