//! Stream capture into CUDA graphs: [`begin`] puts the backend's one stream into capture mode
//! (thread-local, so an allocation or a synchronizing call made by this thread while recording
//! is an error instead of a silent host round trip), [`end`] instantiates what was recorded into
//! a [`CudaStepGraph`] that [`crate::backend::StepGraph::replay`] launches with one driver call.
//!
//! A graph replays the recorded kernels with the recorded arguments: the device pointers it
//! holds (workspace, step metadata, KV cache, weights, cuBLAS's workspace) must stay allocated
//! and unmoved for its life, and whatever changes between replays must be data in those
//! buffers (the step metadata refilled by `update_step_pinned`). The rules every op obeys for
//! this are in docs/architecture.md ("Graph-capturable ops").

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::{dev_err, CudaBackend};
use crate::backend::{BackendError, StepGraph};

/// An instantiated graph of one decode step, replayed on the backend's stream.
pub struct CudaStepGraph {
    graph: CudaGraph,
    prof: Arc<super::profile::Profiler>,
    stream: Arc<CudaStream>,
    device_bytes: usize,
    nodes: usize,
}

// SAFETY: a `CudaGraph` holds raw driver handles (the graph and its executable instance) that
// are not bound to a thread; the driver requires only that calls on one graph be serialized.
// `CudaStepGraph` is owned by one runner, used through `&self` from its one engine thread at a
// time (`ModelRunner: Send`, not `Sync`), and never shared.
unsafe impl Send for CudaStepGraph {}

impl std::fmt::Debug for CudaStepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStepGraph")
            .field("nodes", &self.nodes)
            .field("device_bytes", &self.device_bytes)
            .finish()
    }
}

impl StepGraph for CudaStepGraph {
    fn replay(&self) -> Result<(), BackendError> {
        // The launch binds the context itself; the stream is the one the graph was recorded on.
        let _ = &self.stream;
        self.prof.note_replay();
        self.graph.launch().map_err(dev_err)
    }

    fn device_bytes(&self) -> usize {
        self.device_bytes
    }

    fn nodes(&self) -> usize {
        self.nodes
    }
}

/// Start recording the backend's stream (see the module header). Work queued before is
/// finished first, so nothing eager is still in flight on the stream while it records.
pub(super) fn begin(b: &CudaBackend) -> Result<(), BackendError> {
    b.stream.synchronize().map_err(dev_err)?;
    b.scratch().free_before_capture = b.ctx.mem_get_info().map_err(dev_err)?.0;
    b.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(dev_err)
}

/// Stop recording and instantiate the graph; its device footprint is measured as the drop of
/// free device memory from [`begin`] to after the instantiation and upload (the ops recorded in
/// between allocate nothing: capture would have failed).
pub(super) fn end(b: &CudaBackend) -> Result<Box<dyn StepGraph>, BackendError> {
    let graph = b
        .stream
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(dev_err)?;
    let Some(graph) = graph else {
        return Err(BackendError::Device(
            "the stream capture recorded no graph".into(),
        ));
    };
    let mut nodes = 0usize;
    // SAFETY: a null node array asks only for the count; the graph is live (owned by `graph`).
    let r = unsafe {
        cudarc::driver::sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut nodes)
    };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        nodes = 0;
    }
    let free_before = b.scratch().free_before_capture;
    graph.upload().map_err(dev_err)?;
    b.stream.synchronize().map_err(dev_err)?;
    let free_after = b.ctx.mem_get_info().map_err(dev_err)?.0;
    Ok(Box::new(CudaStepGraph {
        graph,
        prof: b.prof.clone(),
        stream: b.stream.clone(),
        device_bytes: free_before.saturating_sub(free_after),
        nodes,
    }))
}
