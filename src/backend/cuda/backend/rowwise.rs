//! The row- and element-wise ops: the embedding and row gathers, RMSNorm (with the residual add
//! fused), `silu_mul`, `add`, and the SwiGLU of a gate|up product (plain and row-interleaved).
//! The [`Backend`] methods of the same names forward here.
//!
//! [`Backend`]: crate::backend::Backend

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use super::launch::KernelArgs;
use super::{check_len, dev_err, launch, CudaBackend, CudaBuffer, CudaStep, CudaWeight};
use crate::backend::BackendError;

pub(super) fn embedding(
    be: &CudaBackend,
    table: &CudaWeight,
    step: &CudaStep,
    out: &mut CudaBuffer,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "embedding");
    check_len("embedding output", out.len, step.num_tokens * table.k)?;
    if table.packed.is_some() {
        return Err(BackendError::Unsupported(
            "embedding: a packed 4-bit table (embeddings load in 16 bits)".into(),
        ));
    }
    if step.num_tokens == 0 {
        return Ok(());
    }
    if let Some(parts) = &table.gguf {
        let ids = step.token_ids();
        // SAFETY: token ids were range-checked by ForwardBatch::step_input against the
        // vocabulary (the table's rows); `out` holds num_tokens rows of k (checked above).
        return unsafe {
            be.gguf_gather(
                table,
                parts,
                &ids,
                step.num_tokens,
                &mut out.data,
                out.dtype,
            )
        };
    }
    let f = be.for_dtype(
        "embedding output",
        out.dtype,
        &be.k.embedding,
        be.k.embedding_to_f32.as_ref(),
    )?;
    let ids = step.token_ids();
    // SAFETY: token ids were range-checked by ForwardBatch::step_input against the vocabulary
    // (the table's rows); `out` holds num_tokens rows of k (checked above).
    unsafe {
        be.launch_row_gather(
            f,
            &ids,
            step.num_tokens,
            &table.data,
            &mut out.data,
            table.k,
        )
    }
}

pub(super) fn gather_rows(
    be: &CudaBackend,
    x: &CudaBuffer,
    step: &CudaStep,
    dim: usize,
    out: &mut CudaBuffer,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "gather_rows");
    check_len("gather_rows input", x.len, step.num_tokens * dim)?;
    check_len("gather_rows output", out.len, step.num_logit_rows * dim)?;
    if step.num_logit_rows == 0 {
        return Ok(());
    }
    // The embedding kernel is a row gather: out[i] = x[logit_rows[i]].
    let f = &be.k.embedding;
    let rows = step.logit_rows();
    // SAFETY: logit rows are token indices < num_tokens (built by ForwardBatch::step_input) and
    // `x` holds num_tokens rows of dim, `out` num_logit_rows rows (checked above).
    unsafe { be.launch_row_gather(f, &rows, step.num_logit_rows, &x.data, &mut out.data, dim) }
}

pub(super) fn rms_norm(
    be: &CudaBackend,
    x: &CudaBuffer,
    weight: &CudaBuffer,
    out: &mut CudaBuffer,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "rms_norm");
    check_len("rms_norm input", x.len, rows * dim)?;
    check_len("rms_norm output", out.len, rows * dim)?;
    check_len("rms_norm weight", weight.len, dim)?;
    be.expect_compute("rms_norm output", out)?;
    let kernels = (&be.k.rms_norm, be.k.rms_norm_xf32.as_ref());
    be.launch_rms_norm(
        kernels,
        "rms_norm input",
        x,
        None,
        weight,
        out,
        rows,
        dim,
        eps,
        false,
    )
}

pub(super) fn add_rms_norm(
    be: &CudaBackend,
    residual: &mut CudaBuffer,
    delta: &CudaBuffer,
    weight: &CudaBuffer,
    out: &mut CudaBuffer,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "add_rms_norm");
    check_len("add_rms_norm residual", residual.len, rows * dim)?;
    check_len("add_rms_norm delta", delta.len, rows * dim)?;
    check_len("add_rms_norm output", out.len, rows * dim)?;
    be.expect_compute("add_rms_norm delta", delta)?;
    be.expect_compute("add_rms_norm output", out)?;
    let kernels = (&be.k.rms_norm, be.k.rms_norm_rf32.as_ref());
    be.launch_rms_norm(
        kernels,
        "add_rms_norm residual",
        delta,
        Some(residual),
        weight,
        out,
        rows,
        dim,
        eps,
        false,
    )
}

pub(super) fn silu_mul(
    be: &CudaBackend,
    gate: &CudaBuffer,
    up: &CudaBuffer,
    out: &mut CudaBuffer,
    len: usize,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "silu_mul");
    check_len("silu_mul gate", gate.len, len)?;
    check_len("silu_mul up", up.len, len)?;
    check_len("silu_mul output", out.len, len)?;
    if len == 0 {
        return Ok(());
    }
    let st = &be.stream;
    let mut b = launch::KernelArgs::new();
    b.buf(&gate.data, st)
        .buf(&up.data, st)
        .buf(&out.data, st)
        .i64(len as i64);
    // SAFETY: all three buffers hold at least `len` elements; the kernel guards i < n and
    // waits (griddepcontrol.wait) before touching memory, so PDL is allowed.
    unsafe {
        be.launch_args(
            &be.k.silu_mul,
            LaunchConfig::for_num_elems(len as u32),
            &mut b,
            be.pdl_packed(),
        )
    }
}

pub(super) fn add(
    be: &CudaBackend,
    x: &mut CudaBuffer,
    y: &CudaBuffer,
    len: usize,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "add");
    check_len("add x", x.len, len)?;
    check_len("add y", y.len, len)?;
    if len == 0 {
        return Ok(());
    }
    let f = &be.k.add;
    let n = len as i64;
    let mut b = be.stream.launch_builder(f);
    b.arg(&mut x.data).arg(&y.data).arg(&n);
    // SAFETY: both buffers hold at least `len` elements; the kernel guards i < n.
    unsafe { b.launch(LaunchConfig::for_num_elems(len as u32)) }.map_err(dev_err)?;
    Ok(())
}

pub(super) fn swiglu(
    be: &CudaBackend,
    gate_up: &CudaBuffer,
    out: &mut CudaBuffer,
    rows: usize,
    inter: usize,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "swiglu");
    check_len("swiglu gate_up", gate_up.len, rows * 2 * inter)?;
    check_len("swiglu output", out.len, rows * inter)?;
    be.expect_compute("swiglu gate_up", gate_up)?;
    be.expect_compute("swiglu output", out)?;
    let n = rows * inter;
    if n == 0 {
        return Ok(());
    }
    let (r, i) = (rows as i64, inter as i32);
    let mut b = be.stream.launch_builder(&be.k.swiglu);
    b.arg(&gate_up.data).arg(&mut out.data).arg(&r).arg(&i);
    // SAFETY: gate_up holds rows × 2·inter and out rows × inter elements (checked); the kernel
    // guards i < rows × inter.
    unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }.map_err(dev_err)?;
    Ok(())
}

impl CudaBackend {
    /// `out[i, :] = src[idx[i], :]` for `n` rows of `dim` elements through an `embedding_*`
    /// kernel `f` (one block per row).
    ///
    /// # Safety
    /// `idx` holds `n` row indices inside `src`; `out` holds `n × dim` elements of `f`'s output
    /// type and `src` rows of `dim` elements of its input type.
    unsafe fn launch_row_gather(
        &self,
        f: &CudaFunction,
        idx: &CudaView<'_, i32>,
        n: usize,
        src: &CudaSlice<u8>,
        out: &mut CudaSlice<u8>,
        dim: usize,
    ) -> Result<(), BackendError> {
        let d = dim as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(idx).arg(src).arg(out).arg(&d);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller's promise; every thread guards `i < dim` within its row.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// The gate|up product of an interleaved weight (`swiglu_rows`) through cuBLAS (or the
    /// backend's dense kernel) into `scratch` `[rows, 2·inter]`, then `swiglu_il`.
    pub(super) fn interleaved_gate_up_swiglu(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        scratch: &mut CudaBuffer,
        out: &mut CudaBuffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        {
            let _t = self.prof.op(&self.stream, "matmul");
            check_len("gate_up_swiglu weight", w.n, 2 * inter)?;
            let what = ["gate_up_swiglu input", "gate_up_swiglu scratch"];
            self.matmul_checked(what, x, rows, w, scratch)?;
        }
        if rows == 0 {
            return Ok(());
        }
        let _t = self.prof.op(&self.stream, "swiglu");
        check_len("swiglu output", out.len, rows * inter)?;
        self.expect_compute("swiglu output", out)?;
        let (r, i) = (rows as i64, inter as i32);
        let mut b = self.stream.launch_builder(&self.k.swiglu_il);
        b.arg(&scratch.data).arg(&mut out.data).arg(&r).arg(&i);
        // SAFETY: scratch holds rows × 2·inter and out rows × inter elements (checked); the
        // kernel guards i < rows × inter.
        unsafe { b.launch(LaunchConfig::for_num_elems((rows * inter) as u32)) }.map_err(dev_err)?;
        Ok(())
    }

    /// Launch an RMSNorm kernel of `kernels/rms_norm.cu` (`rms_norm_*`) or `kernels/gdn.cu`
    /// (`rms_norm_1p_*`, the `(1 + w)` form: `norm_1p`): one block per row, `residual` None =
    /// the unfused form (a null pointer). Both take (x, residual, weight, out, dim, eps).
    /// `kernels`: the family's compute-dtype kernel and its f32 twin (f32 `x`, or f32 `residual`
    /// when there is one), picked by that buffer's dtype ([`CudaBackend::for_dtype`], `what`
    /// naming it in the error). `pdl`: with the programmatic-dependent-launch attribute (only
    /// for a kernel that waits first). The callers check the lengths.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_rms_norm(
        &self,
        kernels: (&CudaFunction, Option<&CudaFunction>),
        what: &str,
        x: &CudaBuffer,
        residual: Option<&mut CudaBuffer>,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
        pdl: bool,
    ) -> Result<(), BackendError> {
        let dtype = residual.as_ref().map_or(x.dtype, |r| r.dtype);
        let f = self.for_dtype(what, dtype, kernels.0, kernels.1)?;
        if rows == 0 {
            return Ok(());
        }
        let st = &self.stream;
        let mut b = KernelArgs::new();
        b.buf(&x.data, st);
        match residual {
            Some(r) => b.buf(&r.data, st),
            None => b.ptr(0),
        };
        b.buf(&weight.data, st)
            .buf(&out.data, st)
            .i32(dim as i32)
            .f32(eps);
        let threads = if dim >= 1024 {
            1024
        } else {
            (dim.div_ceil(32) * 32) as u32
        };
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x, residual and out hold rows × dim elements and weight dim (checked by the
        // callers); a null residual pointer selects the unfused path in the kernel; `pdl` only
        // for the `rms_norm_1p*` kernels, which wait (griddepcontrol.wait) before touching memory.
        unsafe { self.launch_args(f, cfg, &mut b, pdl) }
    }
}
