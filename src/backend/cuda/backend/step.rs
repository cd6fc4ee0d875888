//! [`CudaStep`]: one step's integer metadata on the device, packed into one `i32` buffer that is
//! written from pinned host staging with one copy per step ([`Staging`]).
//!
//! Layout (`i32`, in this order, each field starting where the previous ends):
//! `token_ids [T] | positions [T] | slot_mapping [T] | token_seq [T] | logit_rows [R] |
//! attn_meta [4·tiles + split] | block_tables [S, max_blocks]`, with T tokens, R logits rows and
//! S sequences; `attn_meta` is [`AttentionPlan::packed`]. A runner keeps one `CudaStep` and
//! refills it each step ([`crate::backend::Backend::update_step`]); its buffers grow only when a
//! step needs more than any before it, so its device addresses are stable.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream, CudaView};

use super::staging::Staging;
use crate::backend::cuda::attention_plan::AttentionPlan;
use crate::backend::{BackendError, StepInput};

/// The packed fields, in layout order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    TokenIds,
    Positions,
    SlotMapping,
    TokenSeq,
    LogitRows,
    AttnMeta,
    BlockTables,
    SeqMeta,
}

/// A sequence of a step as the GDN ops check it (host copy of its `seq_meta` row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SeqSlot {
    /// New tokens.
    pub len: usize,
    /// Tokens before them (0: the sequence starts from a zero state).
    pub cached_len: usize,
    /// Its state slot; `None` only for a decode graph's padding rows (fresh, `cached_len` 0),
    /// which the GDN kernels compute from a zero state without writing any state.
    pub slot: Option<u32>,
}

/// Split-K partial buffers `(max, sum, acc)`.
pub(super) type Partials = (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>);

/// One step's metadata on the device (see the module header).
#[derive(Debug)]
pub struct CudaStep {
    pub(super) num_tokens: usize,
    pub(super) num_logit_rows: usize,
    /// Width of each sequence's row of `block_tables`.
    pub(super) max_blocks: usize,
    /// Largest context (`cached_len + len`) of the step's sequences.
    pub(super) max_context: usize,
    /// Prefill tiles at the start of `attn_meta`.
    pub(super) prefill_tiles: usize,
    /// One-token sequences' token indices after the tiles in `attn_meta`.
    pub(super) split_tokens: usize,
    /// Largest context among the split-K tokens' sequences.
    pub(super) split_max_context: usize,
    /// Context the split-K part count is sized for when pinned
    /// ([`crate::backend::Backend::update_step_pinned`]); 0 = follow the data.
    pub(super) pinned_context: usize,
    /// This step's split-K partials `(max, sum, acc)`, f32, grown to its largest call and kept:
    /// owned by the step (not the backend) so that a graph-replayed step's partials never move
    /// when an eager step needs more.
    partials: Mutex<Option<Partials>>,
    /// The decode kernel's merge tickets (`counters` in attention_decode.cu: one u32 per (row, KV
    /// head), zero between launches, each launch's last block resets its own), grown like
    /// `partials` and zeroed when allocated.
    decode_counters: Mutex<Option<CudaSlice<u32>>>,
    /// Sequences of the step (rows of `block_tables` and `seq_meta`).
    pub(super) num_seqs: usize,
    /// Each sequence's length, cached length and state slot on the host, for the GDN ops'
    /// argument checks.
    pub(super) seq_slots: Vec<SeqSlot>,
    /// Start of each [`Field`] in the buffer, and the end of the last.
    offsets: [usize; 9],
    meta: Staging<i32>,
}

impl CudaStep {
    /// An empty step whose buffers hold `capacity` `i32`s.
    pub(super) fn with_capacity(
        stream: &Arc<CudaStream>,
        capacity: usize,
    ) -> Result<CudaStep, BackendError> {
        Ok(CudaStep {
            num_tokens: 0,
            num_logit_rows: 0,
            max_blocks: 1,
            max_context: 0,
            prefill_tiles: 0,
            split_tokens: 0,
            split_max_context: 0,
            pinned_context: 0,
            partials: Mutex::new(None),
            decode_counters: Mutex::new(None),
            num_seqs: 0,
            seq_slots: Vec::new(),
            offsets: [0; 9],
            meta: Staging::new(stream, capacity)?,
        })
    }

    /// `i32`s the layout of `input` takes (an upper bound used to size a new step).
    pub(super) fn len_for(input: &StepInput) -> usize {
        let n = input.num_tokens();
        let max_blocks = max_blocks(input);
        // Tiles of ≤ TILE_TOKENS tokens: at most n of them, 4 fields each, plus split tokens.
        4 * n + input.logit_rows.len() + 5 * n + input.seqs.len().max(1) * (max_blocks + 4)
    }

    /// Lay `input` out in the host staging and queue its one copy to the device.
    pub(super) fn fill(
        &mut self,
        stream: &Arc<CudaStream>,
        input: &StepInput,
    ) -> Result<(), BackendError> {
        let need = CudaStep::len_for(input);
        if need > self.meta.capacity() {
            // Grow (rare: a step larger than every earlier one); at least double.
            self.meta = Staging::new(stream, need.max(2 * self.meta.capacity()))?;
        }
        let n = input.num_tokens();
        let mb = max_blocks(input);
        let plan = AttentionPlan::new(input);
        let packed = plan.packed();
        let lens = [
            n,
            n,
            n,
            n,
            input.logit_rows.len(),
            packed.len(),
            input.seqs.len().max(1) * mb,
            input.seqs.len().max(1) * 4,
        ];
        let mut offsets = [0usize; 9];
        for (i, l) in lens.iter().enumerate() {
            offsets[i + 1] = offsets[i] + l;
        }
        let host = self.meta.host_mut()?;
        let put = |host: &mut [i32], f: Field, v: &[u32]| {
            let at = offsets[f as usize];
            for (d, &s) in host[at..at + v.len()].iter_mut().zip(v) {
                *d = s as i32;
            }
        };
        put(host, Field::TokenIds, &input.token_ids);
        put(host, Field::Positions, &input.positions);
        put(host, Field::SlotMapping, &input.slot_mapping);
        put(host, Field::LogitRows, &input.logit_rows);
        put(host, Field::AttnMeta, &packed);
        let seq_at = offsets[Field::TokenSeq as usize];
        let tab_at = offsets[Field::BlockTables as usize];
        host[tab_at..offsets[8]].fill(0);
        let meta_at = offsets[Field::SeqMeta as usize];
        for (i, s) in input.seqs.iter().enumerate() {
            host[seq_at + s.token_start..seq_at + s.token_start + s.len].fill(i as i32);
            let row = tab_at + i * mb;
            for (d, &b) in host[row..row + s.block_table.len()]
                .iter_mut()
                .zip(&s.block_table)
            {
                *d = b as i32;
            }
            let m = [
                s.token_start as i32,
                s.len as i32,
                s.cached_len as i32,
                s.state_slot.map_or(-1, |x| x as i32),
            ];
            host[meta_at + 4 * i..meta_at + 4 * i + 4].copy_from_slice(&m);
        }
        self.meta.upload(stream, offsets[8])?;
        self.num_seqs = input.seqs.len();
        self.seq_slots.clear();
        self.seq_slots.extend(input.seqs.iter().map(|s| SeqSlot {
            len: s.len,
            cached_len: s.cached_len,
            slot: s.state_slot,
        }));
        self.offsets = offsets;
        self.num_tokens = n;
        self.num_logit_rows = input.logit_rows.len();
        self.max_blocks = mb;
        self.max_context = input
            .seqs
            .iter()
            .map(|s| s.context_len())
            .max()
            .unwrap_or(0);
        self.prefill_tiles = plan.num_tiles();
        self.split_tokens = plan.split_tokens.len();
        self.split_max_context = plan.split_max_context;
        Ok(())
    }

    /// The split-K partials, grown to hold at least `rows` (max, sum) and `rows × head_dim` acc
    /// values (an allocation only when this step never needed as many).
    pub(super) fn partials(
        &self,
        stream: &Arc<CudaStream>,
        rows: usize,
        head_dim: usize,
    ) -> Result<MutexGuard<'_, Option<Partials>>, BackendError> {
        let mut p = self.partials.lock().unwrap_or_else(|e| e.into_inner());
        let fits = p
            .as_ref()
            .is_some_and(|(m, _, acc)| m.len() >= rows && acc.len() >= rows * head_dim);
        if !fits {
            let err = super::dev_err;
            *p = Some((
                stream.alloc_zeros::<f32>(rows).map_err(err)?,
                stream.alloc_zeros::<f32>(rows).map_err(err)?,
                stream.alloc_zeros::<f32>(rows * head_dim).map_err(err)?,
            ));
        }
        Ok(p)
    }

    /// The decode kernel's merge tickets, grown (zeroed) to hold at least `n`.
    pub(super) fn decode_counters(
        &self,
        stream: &Arc<CudaStream>,
        n: usize,
    ) -> Result<MutexGuard<'_, Option<CudaSlice<u32>>>, BackendError> {
        let mut c = self
            .decode_counters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if c.as_ref().is_none_or(|c| c.len() < n) {
            *c = Some(stream.alloc_zeros::<u32>(n).map_err(super::dev_err)?);
        }
        Ok(c)
    }

    fn range(&self, f: Field) -> Range<usize> {
        let (a, b) = (self.offsets[f as usize], self.offsets[f as usize + 1]);
        // An empty field still needs a valid pointer: point at one element (never read).
        if a == b {
            return a.min(self.meta.capacity() - 1)..a.min(self.meta.capacity() - 1) + 1;
        }
        a..b
    }

    fn view(&self, f: Field) -> CudaView<'_, i32> {
        self.meta.dev().slice(self.range(f))
    }

    /// `[num_tokens]` token ids.
    pub(super) fn token_ids(&self) -> CudaView<'_, i32> {
        self.view(Field::TokenIds)
    }
    /// `[num_tokens]` token ids, to overwrite on the device (fed tokens).
    pub(super) fn token_ids_mut(&mut self) -> cudarc::driver::CudaViewMut<'_, i32> {
        let r = self.range(Field::TokenIds);
        self.meta.dev_mut().slice_mut(r)
    }
    /// `[num_tokens]` positions.
    pub(super) fn positions(&self) -> CudaView<'_, i32> {
        self.view(Field::Positions)
    }
    /// `[num_tokens]` KV slots.
    pub(super) fn slot_mapping(&self) -> CudaView<'_, i32> {
        self.view(Field::SlotMapping)
    }
    /// `[num_tokens]` index of each token's sequence.
    pub(super) fn token_seq(&self) -> CudaView<'_, i32> {
        self.view(Field::TokenSeq)
    }
    /// `[num_logit_rows]` token indices whose logits are kept.
    pub(super) fn logit_rows(&self) -> CudaView<'_, i32> {
        self.view(Field::LogitRows)
    }
    /// `[num_seqs, max_blocks]` block tables.
    pub(super) fn block_tables(&self) -> CudaView<'_, i32> {
        self.view(Field::BlockTables)
    }
    /// `[num_seqs, 4]` per-sequence (token_start, len, cached_len, state slot or −1).
    pub(super) fn seq_meta(&self) -> CudaView<'_, i32> {
        self.view(Field::SeqMeta)
    }
    /// The prefill tiles `[prefill_tiles, 4]` at the start of `attn_meta`.
    pub(super) fn tiles(&self) -> CudaView<'_, i32> {
        let a = self.offsets[Field::AttnMeta as usize];
        let len = self.prefill_tiles * crate::backend::cuda::attention_plan::TILE_FIELDS;
        self.meta.dev().slice(a..a + len.max(1))
    }
    /// The split-K token indices `[split_tokens]` after the tiles.
    pub(super) fn split_index(&self) -> CudaView<'_, i32> {
        let a = self.offsets[Field::AttnMeta as usize]
            + self.prefill_tiles * crate::backend::cuda::attention_plan::TILE_FIELDS;
        self.meta.dev().slice(a..a + self.split_tokens.max(1))
    }
}

/// Block-table width of a step: its longest table (at least 1).
fn max_blocks(input: &StepInput) -> usize {
    input
        .seqs
        .iter()
        .map(|s| s.block_table.len())
        .max()
        .unwrap_or(0)
        .max(1)
}
