//! The prefix store (`--cache-ram`): keys and values of prompt prefixes kept in blocks of
//! a fixed number of tokens, so that a later prompt starting the same way — the same
//! system prompt, the earlier turns of a conversation — restores them instead of running
//! them through the model again.
//!
//! Block `i` holds the keys and values of positions `i·B .. (i+1)·B` of one prompt, and
//! is keyed by a hash chain: `key(i) = hash(key(i − 1), tokens of block i)`, so one key
//! names the whole prefix up to the block's end. A hit is verified: the block's own
//! tokens and its parent's key must match, so a hash collision is a miss, never wrong
//! keys and values. A hybrid model's linear-attention layers summarise the whole prefix in
//! a state that cannot be cut back, so a block also keeps the state after its last
//! position when it was at hand (a prompt read in chunks that end on block boundaries);
//! such a model restores up to the last block of the chain that has one.
//!
//! Blocks are evicted least recently used first within the byte budget. A lookup or an
//! insertion stamps every block of its chain with the same tick, and ties go to the
//! deepest block, so a parent always outlives its children: no block is left unreachable.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;

use fusebox::{ComputeBackend, Result, Tensor};
use fusebox_models::transformer::{KvCache, LinearState};

use crate::metrics::Metrics;

/// Bytes counted for a block beyond its tensors (its map entry, vectors and tokens' own
/// allocation are small but not free).
const BLOCK_OVERHEAD: usize = 256;

struct Block {
    /// The previous block's key (`None`: the prompt's first block).
    parent: Option<u64>,
    /// The block's index in its prompt (0: positions `0..B`).
    depth: usize,
    /// Its `B` tokens.
    tokens: Vec<u32>,
    /// Keys and values of its positions, per layer `[1, Hkv, B, hd]` (host).
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// The linear-attention states after its last position (hybrid models only, when
    /// they were at hand).
    state: Option<Vec<Option<LinearState>>>,
    /// Bytes it takes, as counted against the budget.
    bytes: usize,
    /// When it was last part of a lookup or an insertion.
    used: u64,
}

/// Blocks of prompt prefixes under a byte budget (on the model thread only).
pub struct PrefixStore {
    block: usize,
    budget: usize,
    bytes: usize,
    tick: u64,
    blocks: HashMap<u64, Block>,
}

fn key(parent: Option<u64>, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: the same prefix always gets the same key.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

fn tensor_bytes(ts: &[Tensor]) -> usize {
    ts.iter().map(Tensor::byte_len).sum()
}

fn state_bytes(state: &[Option<LinearState>]) -> usize {
    state.iter().flatten().map(|s| s.conv.byte_len() + s.delta.byte_len()).sum()
}

impl PrefixStore {
    /// A store of blocks of `block` tokens (≥ 1) holding at most `budget` bytes.
    pub fn new(block: usize, budget: usize) -> PrefixStore {
        PrefixStore { block: block.max(1), budget, bytes: 0, tick: 0, blocks: HashMap::new() }
    }

    /// Tokens per block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The keys of the stored blocks that begin `tokens`, in order, as far as they go
    /// (verified, not only hashed), each stamped with `tick`.
    fn chain(&mut self, tokens: &[u32], tick: u64) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut parent = None;
        for (depth, part) in tokens.chunks_exact(self.block).enumerate() {
            let k = key(parent, part);
            match self.blocks.get_mut(&k) {
                Some(b) if b.parent == parent && b.depth == depth && b.tokens == part => {
                    b.used = tick;
                    keys.push(k);
                    parent = Some(k);
                }
                _ => break,
            }
        }
        keys
    }

    /// Restores into `cache` the longest stored prefix of `prompt` of at most `limit`
    /// tokens, when it is longer than the `have` positions the cache already holds of
    /// it, and returns the positions the cache then holds (`have` when nothing longer
    /// was stored). A cache with a linear-attention state restores only to the end of a
    /// block that kept one; keys and values alone may end anywhere.
    pub fn restore(
        &mut self,
        b: &dyn ComputeBackend,
        prompt: &[u32],
        limit: usize,
        have: usize,
        cache: &mut KvCache,
    ) -> Result<usize> {
        self.tick += 1;
        let limit = limit.min(prompt.len());
        let keys = self.chain(prompt, self.tick);
        let (upto, state) = if cache.has_linear_state() {
            let ends_in_reach = |i: &usize| (i + 1) * self.block <= limit;
            match (0..keys.len()).rev().filter(ends_in_reach).find(|&i| self.blocks[&keys[i]].state.is_some()) {
                Some(i) => ((i + 1) * self.block, self.blocks[&keys[i]].state.as_ref()),
                None => return Ok(have),
            }
        } else {
            ((keys.len() * self.block).min(limit), None)
        };
        if upto <= have {
            return Ok(have);
        }
        // Positions below `have` hold the same tokens already; blocks from the one
        // containing `have` on are written.
        for (i, k) in keys.iter().enumerate().take(upto.div_ceil(self.block)).skip(have / self.block) {
            let blk = &self.blocks[k];
            cache.write_positions(b, i * self.block, &blk.k, &blk.v)?;
        }
        if let Some(state) = state {
            cache.set_linear_states(b, state)?;
        }
        cache.len = upto;
        Ok(upto)
    }

    /// Stores the whole blocks of `prompt[..cache.len]` (the positions `cache` holds,
    /// which must be that prompt's) that are not stored yet, evicting the least
    /// recently used blocks to stay within the budget; a block that ends at `cache.len`
    /// keeps the linear-attention states too. Stops at the first block that does not
    /// fit even after eviction.
    pub fn insert(&mut self, b: &dyn ComputeBackend, prompt: &[u32], cache: &KvCache, m: &Metrics) -> Result<()> {
        let held = cache.len.min(prompt.len());
        let whole = held / self.block;
        if whole == 0 {
            return Ok(());
        }
        self.tick += 1;
        let tick = self.tick;
        let keys = self.chain(&prompt[..whole * self.block], tick);
        let recurrent = cache.has_linear_state();
        // The last block ends where the cache does: its state is the cache's now.
        let state_at_end = recurrent && whole * self.block == cache.len;
        if state_at_end && keys.len() == whole {
            let last = keys[whole - 1];
            if self.blocks[&last].state.is_none() {
                let state = cache.copy_linear_states(b)?;
                let extra = state_bytes(&state);
                if !self.make_room(extra, tick, m) {
                    return Ok(());
                }
                let blk = self.blocks.get_mut(&last).expect("a key of the chain just walked");
                blk.state = Some(state);
                blk.bytes += extra;
                self.bytes += extra;
            }
        }
        let mut parent = keys.last().copied();
        for depth in keys.len()..whole {
            let (start, end) = (depth * self.block, (depth + 1) * self.block);
            let tokens = prompt[start..end].to_vec();
            let (k, v) = cache.read_positions(b, start, end)?;
            let state = if state_at_end && depth + 1 == whole { Some(cache.copy_linear_states(b)?) } else { None };
            let bytes = tensor_bytes(&k)
                + tensor_bytes(&v)
                + state.as_deref().map_or(0, state_bytes)
                + tokens.len() * 4
                + BLOCK_OVERHEAD;
            if !self.make_room(bytes, tick, m) {
                break;
            }
            let id = key(parent, &tokens);
            self.blocks.insert(id, Block { parent, depth, tokens, k, v, state, bytes, used: tick });
            self.bytes += bytes;
            parent = Some(id);
        }
        self.publish(m);
        Ok(())
    }

    /// Evicts least recently used blocks (never one stamped `keep`: the chain being
    /// extended) until `bytes` more fit; false when they cannot.
    fn make_room(&mut self, bytes: usize, keep: u64, m: &Metrics) -> bool {
        if bytes > self.budget {
            return false;
        }
        while self.bytes + bytes > self.budget {
            // Oldest first; of equally old blocks the deepest, so parents go after children.
            let victim = self
                .blocks
                .iter()
                .filter(|(_, b)| b.used != keep)
                .min_by_key(|(_, b)| (b.used, std::cmp::Reverse(b.depth)))
                .map(|(k, _)| *k);
            let Some(victim) = victim else { return false };
            let gone = self.blocks.remove(&victim).expect("a key just found");
            self.bytes -= gone.bytes;
            m.prefix_evictions.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    fn publish(&self, m: &Metrics) {
        m.prefix_bytes.store(self.bytes, Ordering::Relaxed);
        m.prefix_blocks.store(self.blocks.len(), Ordering::Relaxed);
    }
}

/// Length of the common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use fusebox_models::pretrained::Pretrained;

    use super::*;

    fn model() -> (std::sync::Arc<dyn ComputeBackend>, Pretrained) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures/arch/qwen3");
        let b: std::sync::Arc<dyn ComputeBackend> = fusebox::create_backend("cpu:1").unwrap();
        let m = fusebox_models::open::load(b.as_ref(), &dir).unwrap();
        (b, m)
    }

    /// A cache of `m` holding `ids`, and the store that took its blocks.
    fn filled(b: &dyn ComputeBackend, m: &Pretrained, store: &mut PrefixStore, ids: &[u32]) -> KvCache {
        let mut cache = m.network.new_cache_of(b, 64, fusebox::DType::F16).unwrap();
        m.network.forward_cached(b, ids, &mut cache).unwrap();
        store.insert(b, ids, &cache, &Metrics::default()).unwrap();
        cache
    }

    fn bytes(ts: &[Tensor]) -> Vec<u8> {
        ts.iter().flat_map(|t| t.host_bytes().unwrap().to_vec()).collect()
    }

    #[test]
    fn a_restored_prefix_has_the_stored_keys_and_values_bit_for_bit() {
        let (b, m) = model();
        let ids: Vec<u32> = (0..20).map(|i| 40 + i).collect();
        let mut store = PrefixStore::new(8, 1 << 20);
        let first = filled(b.as_ref(), &m, &mut store, &ids);
        assert_eq!(store.len(), 2);
        let mut cache = m.network.new_cache_of(b.as_ref(), 64, fusebox::DType::F16).unwrap();
        assert_eq!(store.restore(b.as_ref(), &ids, ids.len() - 1, 0, &mut cache).unwrap(), 16);
        assert_eq!(cache.len, 16);
        let (k0, v0) = first.read_positions(b.as_ref(), 0, 16).unwrap();
        let (k1, v1) = cache.read_positions(b.as_ref(), 0, 16).unwrap();
        assert_eq!(bytes(&k0), bytes(&k1));
        assert_eq!(bytes(&v0), bytes(&v1));
        // No more than `limit`: a prompt of exactly two blocks keeps its last token to run.
        let mut cache = m.network.new_cache_of(b.as_ref(), 64, fusebox::DType::F16).unwrap();
        assert_eq!(store.restore(b.as_ref(), &ids[..16], 15, 0, &mut cache).unwrap(), 15);
        // Nothing longer than what the cache holds: left alone.
        assert_eq!(store.restore(b.as_ref(), &ids, 19, 17, &mut cache).unwrap(), 17);
    }

    #[test]
    fn a_block_whose_tokens_differ_is_a_miss_even_under_its_key() {
        let (b, m) = model();
        let ids: Vec<u32> = (0..12).map(|i| 60 + i).collect();
        let mut store = PrefixStore::new(8, 1 << 20);
        filled(b.as_ref(), &m, &mut store, &ids);
        // As if another prompt's block hashed to the same key.
        store.blocks.values_mut().for_each(|blk| blk.tokens[3] += 1);
        let mut cache = m.network.new_cache_of(b.as_ref(), 64, fusebox::DType::F16).unwrap();
        assert_eq!(store.restore(b.as_ref(), &ids, 11, 0, &mut cache).unwrap(), 0);
        assert_eq!(cache.len, 0);
    }

    #[test]
    fn eviction_takes_the_least_recently_used_blocks_children_before_parents() {
        let (b, m) = model();
        let p: Vec<u32> = (0..17).map(|i| 70 + i).collect();
        let mut q = p.clone();
        q[10] += 50;
        let mut probe = PrefixStore::new(8, 1 << 20);
        filled(b.as_ref(), &m, &mut probe, &p[..8]);
        let block = probe.bytes();
        // Room for two blocks and a half.
        let mut store = PrefixStore::new(8, 2 * block + block / 2);
        let metrics = Metrics::default();
        filled(b.as_ref(), &m, &mut store, &p);
        assert_eq!(store.len(), 2);
        // q shares p's first block: its second evicts p's second, never the shared parent.
        let qcache = {
            let mut c = m.network.new_cache_of(b.as_ref(), 64, fusebox::DType::F16).unwrap();
            m.network.forward_cached(b.as_ref(), &q, &mut c).unwrap();
            c
        };
        store.insert(b.as_ref(), &q, &qcache, &metrics).unwrap();
        assert_eq!(metrics.prefix_evictions.load(Ordering::Relaxed), 1);
        assert_eq!(store.len(), 2);
        assert!(store.bytes() <= 2 * block + block / 2);
        let mut c = m.network.new_cache_of(b.as_ref(), 64, fusebox::DType::F16).unwrap();
        assert_eq!(store.restore(b.as_ref(), &p, 16, 0, &mut c).unwrap(), 8, "p's second block is gone");
        let mut c = m.network.new_cache_of(b.as_ref(), 64, fusebox::DType::F16).unwrap();
        assert_eq!(store.restore(b.as_ref(), &q, 16, 0, &mut c).unwrap(), 16);
    }
}
