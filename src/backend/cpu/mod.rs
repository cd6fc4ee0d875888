//! The CPU backend. (This file is a stub on the `cpu-kernels` branch: the `cpu-model` branch
//! owns it; only the `matmul` module line comes from here.)

pub mod matmul;
