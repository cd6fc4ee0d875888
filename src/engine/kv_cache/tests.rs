//! Tests of the block manager: block hash chains, allocation that fails atomically, prefix
//! reuse and LRU eviction of freed hashed blocks, disabled prefix caching, and the state-slot
//! checkpoints.

use super::*;

fn hashes(tokens: &[u32], bs: usize) -> Vec<BlockHash> {
    let mut h = Vec::new();
    BlockHash::extend_chain(&mut h, tokens, bs);
    h
}

#[test]
fn hash_chain_depends_on_the_whole_prefix() {
    // Same second block, different first block → different second hash.
    let a = hashes(&[1, 2, 3, 4], 2);
    let b = hashes(&[9, 2, 3, 4], 2);
    assert_eq!(a.len(), 2);
    assert_ne!(a[1], b[1]);
    // Only full blocks are hashed: 5 tokens with block 2 → 2 hashes.
    assert_eq!(hashes(&[1, 2, 3, 4, 5], 2), a);
    // Incremental extension equals hashing at once.
    let mut inc = hashes(&[1, 2, 3], 2);
    BlockHash::extend_chain(&mut inc, &[1, 2, 3, 4], 2);
    assert_eq!(inc, a);
}

#[test]
fn allocate_counts_blocks_and_fails_atomically() {
    let mut m = BlockManager::new(4, 4, true);
    let mut s = SeqBlocks::default();
    // 9 tokens with block 4 = 3 blocks.
    m.allocate(&mut s, &[], 9).expect("fits");
    assert_eq!(s.table, vec![0, 1, 2]);
    assert_eq!(m.num_free(), 1);
    // Growing to 12 tokens needs no new block; 13 needs one; 17 needs two (only one left).
    m.allocate(&mut s, &[], 12).expect("same blocks");
    assert_eq!(s.table.len(), 3);
    let err = m.allocate(&mut s, &[], 17).unwrap_err();
    assert_eq!(
        err,
        NoFreeBlocks {
            needed: 2,
            available: 1
        }
    );
    assert_eq!(s.table.len(), 3, "failed allocation changed nothing");
    m.check_invariants();
    m.free(&mut s);
    assert_eq!(m.num_free(), 4);
    m.check_invariants();
}

#[test]
fn full_blocks_are_reused_by_an_identical_prefix() {
    let bs = 4;
    let mut m = BlockManager::new(8, bs, true);
    let prompt: Vec<u32> = (0..10).collect(); // 2 full blocks + 2 tokens
    let h = hashes(&prompt, bs);
    let mut a = SeqBlocks::default();
    assert!(m.lookup_prefix(&h).is_empty());
    m.allocate(&mut a, &[], prompt.len()).expect("fits");
    m.cache_full_blocks(&mut a, &h, prompt.len());
    m.check_invariants();

    // Second sequence, same prompt: both full blocks hit, shared with ref 2.
    let hits = m.lookup_prefix(&h);
    assert_eq!(hits, a.table[..2].to_vec());
    let mut b = SeqBlocks::default();
    m.allocate(&mut b, &hits, prompt.len()).expect("fits");
    assert_eq!(&b.table[..2], &a.table[..2]);
    assert_ne!(b.table[2], a.table[2], "the partial block is private");
    assert_eq!(m.ref_cnt(a.table[0]), 2);
    assert_eq!(m.num_used(), 4);
    m.check_invariants();
}

#[test]
fn freed_hashed_blocks_stay_hittable_until_evicted_lru_first() {
    let bs = 2;
    let mut m = BlockManager::new(3, bs, true);
    let p1 = [1u32, 2, 3, 4];
    let h1 = hashes(&p1, bs);
    let mut a = SeqBlocks::default();
    m.allocate(&mut a, &[], 4).expect("fits");
    m.cache_full_blocks(&mut a, &h1, 4);
    let a_blocks = a.table.clone();
    m.free(&mut a);
    assert_eq!(m.num_free(), 3, "evictable blocks count as free");
    m.check_invariants();
    // Still a hit after the owner is gone.
    assert_eq!(m.lookup_prefix(&h1), a_blocks);

    // A 6-token sequence needs 3 blocks: the free one, then evictions. Blocks were freed
    // tail first, so the prefix's second block is evicted before its first.
    let mut b = SeqBlocks::default();
    m.allocate(&mut b, &[], 4).expect("fits");
    assert_eq!(
        m.lookup_prefix(&h1),
        vec![a_blocks[0]],
        "tail block evicted first"
    );
    m.allocate(&mut b, &[], 6).expect("fits");
    assert!(m.lookup_prefix(&h1).is_empty());
    m.check_invariants();
}

#[test]
fn taking_an_evictable_hit_reduces_what_is_available() {
    let bs = 2;
    let mut m = BlockManager::new(2, bs, true);
    let p = [5u32, 6, 7];
    let h = hashes(&p, bs);
    let mut a = SeqBlocks::default();
    m.allocate(&mut a, &[], 3).expect("fits");
    m.cache_full_blocks(&mut a, &h, 3);
    m.free(&mut a);
    // Hit 1 evictable block; 5 tokens need 3 blocks: 1 hit + 2 new, but only 1 is left
    // once the hit is taken out of the LRU.
    let hits = m.lookup_prefix(&h);
    assert_eq!(hits.len(), 1);
    let mut b = SeqBlocks::default();
    assert_eq!(
        m.allocate(&mut b, &hits, 5),
        Err(NoFreeBlocks {
            needed: 2,
            available: 1
        })
    );
    m.allocate(&mut b, &hits, 4).expect("1 hit + 1 new");
    assert_eq!(m.num_free(), 0);
    m.check_invariants();
}

#[test]
fn duplicate_prefix_computed_twice_registers_once() {
    let bs = 2;
    let mut m = BlockManager::new(4, bs, true);
    let p = [1u32, 2, 3];
    let h = hashes(&p, bs);
    let (mut a, mut b) = (SeqBlocks::default(), SeqBlocks::default());
    m.allocate(&mut a, &[], 3).expect("fits");
    m.allocate(&mut b, &[], 3).expect("fits");
    m.cache_full_blocks(&mut a, &h, 3);
    m.cache_full_blocks(&mut b, &h, 3);
    m.check_invariants();
    assert_eq!(m.lookup_prefix(&h), vec![a.table[0]]);
    m.free(&mut b);
    m.free(&mut a);
    m.check_invariants();
    assert_eq!(m.num_free(), 4);
}

#[test]
fn disabled_prefix_caching_never_hits() {
    let bs = 2;
    let mut m = BlockManager::new(4, bs, false);
    let p = [1u32, 2, 3, 4];
    let h = hashes(&p, bs);
    let mut a = SeqBlocks::default();
    m.allocate(&mut a, &[], 4).expect("fits");
    m.cache_full_blocks(&mut a, &h, 4);
    m.free(&mut a);
    assert!(m.lookup_prefix(&h).is_empty());
    m.check_invariants();
}

#[test]
fn state_checkpoints_replace_the_least_recently_used() {
    let h = |i: u32| BlockHash::chain(None, &[i]);
    let mut c = StateCheckpoints::new(4, 2);
    assert_eq!(c.insert(h(1)), Some(4));
    assert_eq!(c.insert(h(2)), Some(5));
    assert_eq!(c.insert(h(2)), None, "already checkpointed");
    assert_eq!(c.use_checkpoint(&h(1)), Some(4)); // 2 is now the oldest
    assert_eq!(c.insert(h(3)), Some(5));
    assert!(!c.contains(&h(2)) && c.contains(&h(1)) && c.contains(&h(3)));
    assert_eq!(c.len(), 2);
    assert_eq!(StateCheckpoints::new(0, 0).insert(h(1)), None);
    let mut s = StateSlots::new(2);
    let mut a = s.take();
    assert_eq!((a, s.take(), s.take()), (Some(0), Some(1), None));
    s.give_back(&mut a);
    assert_eq!((a, s.num_used()), (None, 1));
}
