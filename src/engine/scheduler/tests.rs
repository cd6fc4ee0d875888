//! Unit tests of the scheduler (admission, chunked prefill, preemption, prefix hits, state
//! slots and checkpoints).

use super::*;
use crate::engine::request::SamplingParams;
use crate::engine::test_support::byte_tokenizer;

fn scheduler(
    num_blocks: usize,
    bs: usize,
    max_num_seqs: usize,
    budget: usize,
    caching: bool,
) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: budget,
        max_model_len: 1000,
    };
    Scheduler::new(cfg, BlockManager::new(num_blocks, bs, caching))
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (seed * 31 + i * 7) % 200).collect()
}

fn add(s: &mut Scheduler, id: RequestId, ids: Vec<u32>, max_tokens: u32) {
    let max_len = s
        .admission_limit(ids.len(), Some(max_tokens))
        .expect("admissible");
    let bs = s.kv().block_size();
    let seq = Sequence::new(
        id,
        ids,
        &SamplingParams::default(),
        &[],
        max_len,
        bs,
        None,
        Instant::now(),
    );
    s.add(seq);
}

/// One engine step without a model: schedule, mark computed, sample `a` where due, drop
/// finished sequences. Checks the invariants after it.
fn step(s: &mut Scheduler) -> SchedulerOutput {
    let tok = byte_tokenizer();
    let out = s.schedule(Instant::now());
    s.complete_step(&out.scheduled);
    let mut row = vec![0.0f32; 257];
    row[b'a' as usize] = 1.0;
    let bs = s.kv().block_size();
    for sc in out.scheduled.iter().filter(|sc| sc.sample) {
        let seq = s.get_mut(sc.id).expect("scheduled");
        if seq
            .sample_and_append(&row, &tok, bs, Instant::now())
            .expect("sample")
            .is_some()
        {
            s.remove(sc.id);
        }
    }
    s.check_invariants();
    out
}

fn shares(out: &SchedulerOutput) -> Vec<(RequestId, usize, usize, bool)> {
    out.scheduled
        .iter()
        .map(|s| (s.id, s.cached_len, s.num_new_tokens, s.sample))
        .collect()
}

impl Scheduler {
    fn check_invariants(&self) {
        self.kv.check_invariants();
        assert!(self.running.len() <= self.cfg.max_num_seqs);
        assert_eq!(self.running.len() + self.waiting.len(), self.seqs.len());
        for id in &self.waiting {
            let s = &self.seqs[id];
            assert_eq!(s.status, SequenceStatus::Waiting);
            assert!(
                s.blocks.is_empty() && s.num_computed_tokens == 0 && s.state_slot.is_none(),
                "waiting {id} holds state"
            );
        }
        let mut used = 0;
        for id in &self.running {
            let s = &self.seqs[id];
            assert_eq!(s.status, SequenceStatus::Running);
            assert!(s.blocks.table.len() * self.kv.block_size() >= s.num_computed_tokens);
            used += s.blocks.table.len();
        }
        // Blocks can be shared, so the tables hold at least the used blocks.
        assert!(used >= self.kv.num_used());
        if self.states.enabled() {
            let mut slots: Vec<u32> = self
                .running
                .iter()
                .map(|id| self.seqs[id].state_slot.expect("running holds a slot"))
                .collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), self.running.len(), "slots are not shared");
            assert_eq!(self.states.num_used(), self.running.len());
        }
    }
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_under_the_budget() {
    let mut s = scheduler(64, 4, 4, 8, false);
    add(&mut s, 1, prompt(1, 20), 2);
    assert_eq!(shares(&step(&mut s)), vec![(1, 0, 8, false)]);
    assert_eq!(shares(&step(&mut s)), vec![(1, 8, 8, false)]);
    assert_eq!(shares(&step(&mut s)), vec![(1, 16, 4, true)]);
    assert_eq!(shares(&step(&mut s)), vec![(1, 20, 1, true)]);
    assert!(s.is_empty(), "max_tokens 2 reached");
}

#[test]
fn decodes_and_a_prefill_chunk_share_a_step() {
    let mut s = scheduler(64, 4, 4, 8, false);
    add(&mut s, 1, prompt(1, 4), 10);
    assert_eq!(shares(&step(&mut s)), vec![(1, 0, 4, true)]);
    add(&mut s, 2, prompt(2, 10), 10);
    // Decode of 1 takes one token of the budget; 2 gets a 7-token chunk, then the rest.
    assert_eq!(
        shares(&step(&mut s)),
        vec![(1, 4, 1, true), (2, 0, 7, false)]
    );
    assert_eq!(
        shares(&step(&mut s)),
        vec![(1, 5, 1, true), (2, 7, 3, true)]
    );
    let out = step(&mut s);
    assert_eq!(out.num_batched_tokens, 2);
}

#[test]
fn max_num_seqs_bounds_the_running_set() {
    let mut s = scheduler(64, 4, 2, 100, false);
    for id in 1..=3 {
        add(&mut s, id, prompt(id as u32, 3), 1);
    }
    assert_eq!(step(&mut s).scheduled.len(), 2);
    // Both finished (max_tokens 1); the third is admitted now.
    assert_eq!(shares(&step(&mut s)), vec![(3, 0, 3, true)]);
}

#[test]
fn the_newest_sequence_is_preempted_and_recomputed_first() {
    // 4 blocks of 4 tokens. Two 7-token prompts take 2 blocks each.
    let mut s = scheduler(4, 4, 4, 64, false);
    add(&mut s, 1, prompt(1, 7), 20);
    add(&mut s, 2, prompt(2, 7), 20);
    assert_eq!(step(&mut s).scheduled.len(), 2);
    // Both now hold 8 tokens (7 computed): the 8th still fits in 2 blocks.
    assert!(step(&mut s).preempted.is_empty());
    // The 9th token needs a third block for sequence 1: sequence 2 (newest) is preempted.
    let out = step(&mut s);
    assert_eq!(out.preempted, vec![2]);
    assert_eq!(shares(&out), vec![(1, 8, 1, true)]);
    let two = s.get(2).expect("kept");
    assert_eq!(
        (two.status, two.num_computed_tokens, two.num_tokens()),
        (SequenceStatus::Waiting, 0, 9)
    );
    assert_eq!(s.num_preemptions(), 1);
    // It waits while 1 holds 3 blocks and cannot fit (9 tokens = 3 blocks > 1 free).
    assert_eq!(shares(&step(&mut s)), vec![(1, 9, 1, true)]);
    // Finish 1 (20 tokens would need 5 blocks: capped to capacity, see admission_limit).
    while s.get(1).is_some() {
        step(&mut s);
    }
    // 2 is recomputed from prompt + its generated tokens in one chunk.
    let out = step(&mut s);
    assert_eq!(shares(&out), vec![(2, 0, 9, true)]);
}

#[test]
fn a_preempted_sequence_rehits_its_own_cached_blocks() {
    // 4 blocks of 4. Sequence 1: 7-token prompt, 3 new tokens; sequence 2: 4-token prompt.
    let mut s = scheduler(4, 4, 4, 64, true);
    add(&mut s, 1, prompt(1, 7), 3);
    add(&mut s, 2, prompt(2, 4), 20);
    step(&mut s); // 1: 2 blocks, 2: 1 block (full and hashed once computed)
    step(&mut s); // 2 takes the last free block for its 5th token
                  // 1 needs a third block: 2 is preempted. Its unhashed block goes to the free list (and
                  // to 1); its hashed first block goes to the evictable LRU. 1 reaches max_tokens.
    let out = step(&mut s);
    assert_eq!(out.preempted, vec![2]);
    assert!(s.get(1).is_none());
    // 2 comes back with its first block served from the cache: 4 of its 6 tokens.
    assert_eq!(shares(&step(&mut s)), vec![(2, 4, 2, true)]);
    assert_eq!(
        s.get(2).expect("running").cached_prompt_tokens,
        Some(0),
        "set at first admission"
    );
}

#[test]
fn prefix_hits_leave_the_last_token_to_compute() {
    let mut s = scheduler(16, 4, 4, 64, true);
    let p = prompt(5, 8);
    add(&mut s, 1, p.clone(), 1);
    step(&mut s);
    assert!(s.is_empty());
    // Same 8 tokens: 2 full blocks cached, but only 1 may be used ((8 - 1) / 4).
    add(&mut s, 2, p.clone(), 1);
    assert_eq!(shares(&step(&mut s)), vec![(2, 4, 4, true)]);
    // One more token: both blocks hit, one token computed.
    let mut longer = p.clone();
    longer.push(9);
    add(&mut s, 3, longer, 1);
    let out = s.schedule(Instant::now());
    assert_eq!(shares(&out), vec![(3, 8, 1, true)]);
    assert_eq!(s.get(3).expect("running").cached_prompt_tokens, Some(8));
    assert_eq!(s.kv().prefix_cache_stats().hit_tokens, 4 + 8);
}

#[test]
fn admission_refuses_what_can_never_fit() {
    // 4 blocks of 4 tokens: the cache holds 16 tokens.
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        max_model_len: 10,
    };
    let s = Scheduler::new(cfg, BlockManager::new(4, 4, false));
    assert!(matches!(
        s.admission_limit(10, None),
        Err(EngineError::InvalidInput(_))
    ));
    assert!(matches!(
        s.admission_limit(0, None),
        Err(EngineError::InvalidInput(_))
    ));
    assert_eq!(s.admission_limit(9, None), Ok(10));
    assert_eq!(s.admission_limit(3, Some(2)), Ok(5));
    let big = Scheduler::new(
        SchedulerConfig {
            max_model_len: 100,
            ..cfg
        },
        BlockManager::new(4, 4, false),
    );
    assert!(matches!(
        big.admission_limit(17, None),
        Err(EngineError::Oom(_))
    ));
    // 16 tokens computed + the last one sampled.
    assert_eq!(big.admission_limit(16, None), Ok(17));
}

#[test]
fn removing_a_sequence_frees_its_blocks() {
    let mut s = scheduler(8, 4, 4, 64, false);
    add(&mut s, 1, prompt(1, 10), 5);
    add(&mut s, 2, prompt(2, 3), 5);
    step(&mut s);
    assert_eq!(s.kv().num_used(), 4);
    assert!(s.remove(1).is_some());
    assert_eq!(s.kv().num_used(), 1);
    assert_eq!(s.num_running(), 1);
    s.check_invariants();
}

#[test]
fn state_slots_bound_the_running_set_and_follow_preemption() {
    // 4 blocks of 4 tokens, 2 state slots: the third sequence waits for a slot.
    let mut s = scheduler(4, 4, 8, 64, false).with_state_slots(2);
    add(&mut s, 1, prompt(1, 3), 20);
    add(&mut s, 2, prompt(2, 3), 20);
    add(&mut s, 3, prompt(3, 3), 1);
    let out = step(&mut s);
    assert_eq!(out.scheduled.len(), 2);
    let slots: Vec<_> = [1, 2]
        .iter()
        .map(|&id| s.get(id).unwrap().state_slot)
        .collect();
    assert_eq!(slots, vec![Some(0), Some(1)]);
    assert_eq!(s.get(3).unwrap().state_slot, None);
    // Sequence 2 is removed: 3 takes its slot.
    s.remove(2);
    let out = step(&mut s);
    assert_eq!(shares(&out), vec![(1, 3, 1, true), (3, 0, 3, true)]);
    assert!(
        s.get(3).is_none(),
        "3 finished (max_tokens 1) and gave its slot back"
    );
    assert_eq!(s.state_slots().num_used(), 1);
    // 1 keeps growing alone; nothing else is running, so nothing is preempted.
    add(&mut s, 4, prompt(4, 7), 20);
    let mut preempted = false;
    for _ in 0..12 {
        let out = step(&mut s);
        if out.preempted.contains(&4) {
            preempted = true;
            assert_eq!(
                s.get(4).unwrap().state_slot,
                None,
                "a preempted sequence holds no slot"
            );
        }
    }
    assert!(preempted, "the cache of 16 tokens cannot hold both");
}
