//! The daemon: inputs/ → ledger → engine → outputs/.

pub mod intake;
pub mod openai;
pub mod retry;
pub mod task_log;
pub mod watcher;
pub mod writer;
