//! The daemon: inputs/ → ledger → engine → outputs/.

pub mod intake;
pub mod openai;
pub mod progress;
pub mod retry;
pub mod systemd;
pub mod task_log;
pub mod watcher;
pub mod writer;
