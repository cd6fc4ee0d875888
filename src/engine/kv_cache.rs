//! The paged KV-cache block manager: which physical blocks hold which sequence's keys and values.
//!
//! The runner owns the memory (`num_blocks` blocks of `block_size` token slots, all layers); this
//! module only does the bookkeeping, modelled on vLLM v1's `BlockPool` / `KVCacheManager`:
//!
//! - **Free list.** Blocks nobody uses and that hold nothing reusable.
//! - **Reference counts.** A block is used by `ref_cnt` sequences; only full, hashed blocks are
//!   ever shared, and a shared block is never written again (new tokens always go to a block of
//!   their own), so no copy-on-write is needed.
//! - **Prefix caching.** Every FULL block of a token sequence has a [`BlockHash`] chained from
//!   its parent: `hash(parent_hash, token ids of the block)`, so equal hashes mean equal whole
//!   prefixes. Once a block's tokens are computed, its hash is registered; a new sequence whose
//!   leading block hashes are registered reuses those blocks instead of recomputing them.
//! - **LRU of evictable blocks.** A hashed block whose last user frees it keeps its contents and
//!   moves to an LRU list; it can still be hit, and it is only evicted (its hash forgotten) when
//!   the free list is empty and a block is needed. Sequences free their blocks tail first, so the
//!   end of a prefix is evicted before its beginning.
//!
//! Invariants (checked by the tests):
//! - every block is in exactly one place: the free list (ref 0, no hash), the evictable LRU
//!   (ref 0, hashed), or used (ref ≥ 1);
//! - `cached` maps a hash to a block whose `hash` field is that hash, and nothing else;
//! - a sequence's table holds `num_hashed` leading blocks that are full and hashed (or duplicates
//!   of a hashed block), then blocks being filled.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

/// Physical KV block id (index into the runner's cache).
pub type BlockId = u32;

/// Hash of a full block together with every block before it (a hash chain).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash([u8; 32]);

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockHash({})", hex::encode(&self.0[..8]))
    }
}

impl BlockHash {
    /// SHA-256 over the parent's hash (32 zero bytes for the first block) and the block's token
    /// ids as little-endian u32. A cryptographic hash: a collision would silently serve another
    /// prompt's keys and values.
    pub fn chain(parent: Option<&BlockHash>, tokens: &[u32]) -> BlockHash {
        let mut h = Sha256::new();
        h.update(parent.map_or([0u8; 32], |p| p.0));
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        BlockHash(h.finalize().into())
    }

    /// Extend `hashes` (the chain over the full blocks of `tokens` computed so far) with the
    /// hashes of every block of `tokens` that has become full since.
    pub fn extend_chain(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
        while (hashes.len() + 1) * block_size <= tokens.len() {
            let i = hashes.len();
            let h = BlockHash::chain(hashes.last(), &tokens[i * block_size..(i + 1) * block_size]);
            hashes.push(h);
        }
    }
}

/// The blocks one sequence holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeqBlocks {
    /// Physical block ids in logical order: token `p` lives in `table[p / block_size]`.
    pub table: Vec<BlockId>,
    /// Leading entries of `table` that are full and already offered to the prefix cache.
    num_hashed: usize,
}

impl SeqBlocks {
    /// Whether the sequence holds no block.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// Not enough free (or evictable) blocks for an allocation; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache: {needed} blocks needed, {available} available")]
pub struct NoFreeBlocks {
    /// Blocks the allocation needed.
    pub needed: usize,
    /// Blocks that could be handed out.
    pub available: usize,
}

#[derive(Debug, Clone, Copy, Default)]
struct BlockMeta {
    ref_cnt: u32,
    /// Set once the block is registered in `cached` (it is then full and immutable).
    hash: Option<BlockHash>,
    /// Position in the evictable LRU while `ref_cnt == 0 && hash.is_some()`.
    lru_tick: u64,
}

/// Prefix-cache counters (in tokens), for logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompt tokens looked up.
    pub queried_tokens: u64,
    /// Of those, tokens served from cached blocks.
    pub hit_tokens: u64,
}

/// Recurrent-state slots of a hybrid model (Qwen3.5): the runner owns their memory; this is the
/// free list. A running sequence holds exactly one; waiting sequences hold none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSlots {
    total: usize,
    /// Free slot ids, lowest first out.
    free: Vec<u32>,
}

impl StateSlots {
    /// `total` free slots (0 for pure attention models: [`StateSlots::enabled`] is false).
    pub fn new(total: usize) -> StateSlots {
        StateSlots {
            total,
            free: (0..total as u32).rev().collect(),
        }
    }

    /// Whether the model needs slots at all.
    pub fn enabled(&self) -> bool {
        self.total > 0
    }

    /// Slots in all.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Slots in use.
    pub fn num_used(&self) -> usize {
        self.total - self.free.len()
    }

    /// Take a free slot, if any.
    pub fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Give `slot` back (taken from `slot.take()` so it cannot be returned twice).
    pub fn give_back(&mut self, slot: &mut Option<u32>) {
        if let Some(s) = slot.take() {
            debug_assert!(!self.free.contains(&s) && (s as usize) < self.total);
            self.free.push(s);
        }
    }
}

/// Prefix checkpoints of a hybrid model: state slots holding the recurrent + conv state after
/// a cached prefix, keyed by the hash of the prefix's last full block (the chain hash names the
/// whole prefix). At most `slots` of them; the least recently used is replaced first. A
/// checkpoint is only useful while the KV blocks of its prefix are cached too: the scheduler
/// uses the longest prefix with both.
#[derive(Debug, Clone, Default)]
pub struct StateCheckpoints {
    free: Vec<u32>,
    by_hash: HashMap<BlockHash, u32>,
    /// Oldest use first.
    lru: std::collections::VecDeque<BlockHash>,
    slots: usize,
}

impl StateCheckpoints {
    /// Checkpoints in slots `first .. first + n` of the runner's state cache.
    pub fn new(first: u32, n: usize) -> StateCheckpoints {
        StateCheckpoints {
            free: (first..first + n as u32).rev().collect(),
            slots: n,
            ..StateCheckpoints::default()
        }
    }

    /// Slots set aside for checkpoints.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Whether any slot is set aside for checkpoints.
    pub fn enabled(&self) -> bool {
        self.slots > 0
    }

    /// Checkpoints held.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Whether the prefix ending with the block hashed `h` has a checkpoint.
    pub fn contains(&self, h: &BlockHash) -> bool {
        self.by_hash.contains_key(h)
    }

    /// The checkpoint slot of the prefix ending with `h`, marked as just used.
    pub fn use_checkpoint(&mut self, h: &BlockHash) -> Option<u32> {
        let slot = *self.by_hash.get(h)?;
        self.lru.retain(|x| x != h);
        self.lru.push_back(*h);
        Some(slot)
    }

    /// A slot to write the checkpoint of the prefix ending with `h` into (a free one, else the
    /// least recently used checkpoint's); `None` when `h` has one already or none is set aside.
    pub fn insert(&mut self, h: BlockHash) -> Option<u32> {
        if !self.enabled() || self.by_hash.contains_key(&h) {
            return None;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let old = self.lru.pop_front()?;
                self.by_hash.remove(&old).expect("lru entries are mapped")
            }
        };
        self.by_hash.insert(h, slot);
        self.lru.push_back(h);
        Some(slot)
    }
}

/// Free list, reference counts, prefix cache and evictable LRU over `num_blocks` blocks.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    enable_prefix_caching: bool,
    blocks: Vec<BlockMeta>,
    /// Unused blocks with no reusable contents; popped from the end.
    free: Vec<BlockId>,
    /// Unused hashed blocks, least recently freed first (key: `lru_tick`).
    evictable: BTreeMap<u64, BlockId>,
    /// Registered full blocks by chain hash.
    cached: HashMap<BlockHash, BlockId>,
    next_tick: u64,
    stats: PrefixCacheStats,
}

impl BlockManager {
    /// A manager for `num_blocks` blocks of `block_size` tokens, all free.
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        assert!(
            num_blocks <= BlockId::MAX as usize,
            "too many KV blocks for u32 ids"
        );
        BlockManager {
            block_size,
            enable_prefix_caching,
            blocks: vec![BlockMeta::default(); num_blocks],
            // Reversed so that blocks are handed out as 0, 1, 2, … (easier to read in logs).
            free: (0..num_blocks as BlockId).rev().collect(),
            evictable: BTreeMap::new(),
            cached: HashMap::new(),
            next_tick: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now (free + evictable).
    pub fn num_free(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching
    }

    /// Prefix-cache counters since start.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// The longest run of leading `hashes` whose blocks are registered, as block ids. Read-only:
    /// pass the result to [`BlockManager::allocate`] to take the blocks. Empty when prefix
    /// caching is off.
    pub fn lookup_prefix(&self, hashes: &[BlockHash]) -> Vec<BlockId> {
        if !self.enable_prefix_caching {
            return Vec::new();
        }
        hashes
            .iter()
            .map_while(|h| self.cached.get(h).copied())
            .collect()
    }

    /// Count one admission's prefix lookup in the stats (`queried` and `hit` in tokens).
    pub fn record_lookup(&mut self, queried: usize, hit: usize) {
        self.stats.queried_tokens += queried as u64;
        self.stats.hit_tokens += hit as u64;
    }

    /// Make `seq` cover `num_tokens` tokens: first append the prefix-cache hits `computed` (only
    /// allowed while `seq` holds no block), then fresh blocks. All or nothing: on
    /// [`NoFreeBlocks`] nothing changed.
    pub fn allocate(
        &mut self,
        seq: &mut SeqBlocks,
        computed: &[BlockId],
        num_tokens: usize,
    ) -> Result<(), NoFreeBlocks> {
        debug_assert!(
            computed.is_empty() || seq.table.is_empty(),
            "cache hits only at admission"
        );
        let have = seq.table.len() + computed.len();
        let needed = self.blocks_for(num_tokens).saturating_sub(have);
        // Hits sitting in the evictable LRU stop being available once taken.
        let evictable_hits = computed
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_cnt == 0)
            .count();
        let available = self.num_free() - evictable_hits;
        if needed > available {
            return Err(NoFreeBlocks { needed, available });
        }
        for &b in computed {
            self.take_shared(b);
            seq.table.push(b);
        }
        seq.num_hashed += computed.len();
        for _ in 0..needed {
            let b = self.pop_free();
            seq.table.push(b);
        }
        Ok(())
    }

    /// Register the blocks of `seq` that became full now that `num_computed_tokens` tokens are
    /// in the cache. `hashes` is the chain over the sequence's full blocks (it may run ahead of
    /// the computed tokens). A block whose hash is already registered (another sequence computed
    /// the same prefix at the same time) stays private and is freed normally.
    pub fn cache_full_blocks(
        &mut self,
        seq: &mut SeqBlocks,
        hashes: &[BlockHash],
        num_computed_tokens: usize,
    ) {
        let full = (num_computed_tokens / self.block_size)
            .min(hashes.len())
            .min(seq.table.len());
        if !self.enable_prefix_caching {
            seq.num_hashed = seq.num_hashed.max(full);
            return;
        }
        for i in seq.num_hashed..full {
            let b = seq.table[i];
            let meta = &mut self.blocks[b as usize];
            if meta.hash.is_none() && !self.cached.contains_key(&hashes[i]) {
                meta.hash = Some(hashes[i]);
                self.cached.insert(hashes[i], b);
            }
        }
        seq.num_hashed = seq.num_hashed.max(full);
    }

    /// Release every block of `seq`, tail first. Hashed blocks keep their contents in the
    /// evictable LRU; the others go back to the free list.
    pub fn free(&mut self, seq: &mut SeqBlocks) {
        for &b in seq.table.iter().rev() {
            let meta = &mut self.blocks[b as usize];
            debug_assert!(meta.ref_cnt > 0, "double free of block {b}");
            meta.ref_cnt -= 1;
            if meta.ref_cnt == 0 {
                if meta.hash.is_some() {
                    meta.lru_tick = self.next_tick;
                    self.evictable.insert(self.next_tick, b);
                    self.next_tick += 1;
                } else {
                    self.free.push(b);
                }
            }
        }
        seq.table.clear();
        seq.num_hashed = 0;
    }

    /// Take one more reference on a registered block, pulling it out of the LRU if unused.
    fn take_shared(&mut self, b: BlockId) {
        let meta = &mut self.blocks[b as usize];
        debug_assert!(meta.hash.is_some(), "cache hit on an unhashed block {b}");
        if meta.ref_cnt == 0 {
            self.evictable.remove(&meta.lru_tick);
        }
        meta.ref_cnt += 1;
    }

    /// Hand out an unused block: from the free list, else by evicting the least recently freed
    /// cached block. The caller checked that one exists.
    fn pop_free(&mut self) -> BlockId {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first().expect("caller checked num_free");
                let meta = &mut self.blocks[b as usize];
                if let Some(h) = meta.hash.take() {
                    self.cached.remove(&h);
                }
                b
            }
        };
        self.blocks[b as usize].ref_cnt = 1;
        b
    }

    /// Check the invariants listed in the module header; panics with the first violation.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut seen = vec![0u8; self.blocks.len()];
        for &b in &self.free {
            let m = self.blocks[b as usize];
            assert!(
                m.ref_cnt == 0 && m.hash.is_none(),
                "free block {b} is {m:?}"
            );
            seen[b as usize] += 1;
        }
        for (&tick, &b) in &self.evictable {
            let m = self.blocks[b as usize];
            assert!(
                m.ref_cnt == 0 && m.hash.is_some() && m.lru_tick == tick,
                "evictable {b}: {m:?}"
            );
            seen[b as usize] += 1;
        }
        for (b, m) in self.blocks.iter().enumerate() {
            if m.ref_cnt > 0 {
                seen[b] += 1;
            }
            assert_eq!(seen[b], 1, "block {b} is in {} places ({m:?})", seen[b]);
        }
        for (h, &b) in &self.cached {
            assert_eq!(
                self.blocks[b as usize].hash.as_ref(),
                Some(h),
                "cached map points at {b}"
            );
        }
        let hashed = self.blocks.iter().filter(|m| m.hash.is_some()).count();
        assert_eq!(hashed, self.cached.len(), "hashed blocks vs cache map");
    }

    /// Reference count of a block (tests).
    #[cfg(test)]
    pub(crate) fn ref_cnt(&self, b: BlockId) -> u32 {
        self.blocks[b as usize].ref_cnt
    }
}

#[cfg(test)]
mod tests;
