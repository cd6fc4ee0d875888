//! Compute backends. `cpu` is always built and is the numerical reference; `cuda` sits behind
//! the `cuda` feature and must match `cpu` within named tolerances.
//!
//! (Skeleton: the `Backend` trait is being written with the CPU backend.)

#[cfg(feature = "cuda")]
pub mod cuda;
