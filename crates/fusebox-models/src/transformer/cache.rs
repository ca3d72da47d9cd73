//! What one generation stream keeps: per-layer key and value caches (softmax-attention
//! layers) or a fixed-size state (linear-attention layers), and the rotary tables for
//! the positions they hold.
//!
//! Keys and values are backed for the positions a stream has reached, in whole blocks of
//! [`KV_BLOCK`] positions, not for the capacity it may reach: the server's `--parallel`
//! slots of `--ctx-size` positions take memory for what their sequences hold. A pass
//! that needs more positions grows the cache first ([`KvCache::reserve`]): to at least
//! half as much again, so a stream that reaches `n` positions copies its keys and values
//! a logarithmic number of times; the copy keeps every bit, and attention reads the same
//! positions whatever the backing, so the logits do not depend on it.

use fusebox::{ComputeBackend, DType, Error, Result, Shape, Tensor};

use super::arch::{Arch, LayerAttention, Positions, Rope};
use super::Transformer;

/// `cos`/`sin` tables `[positions, rotary_dims/2]` of the global rope and, when local
/// layers have their own base, of the local one.
#[derive(Debug, Clone)]
pub struct RopeTables {
    global: Option<(Tensor, Tensor)>,
    local: Option<(Tensor, Tensor)>,
    /// Which table each layer reads (true: local).
    layer_local: Vec<bool>,
    /// The ropes and rotary dims the tables are of, to extend them (none for learned
    /// positions).
    source: Option<RopeSource>,
}

/// What [`RopeTables`] are computed from.
#[derive(Debug, Clone)]
struct RopeSource {
    global: Rope,
    /// The local layers' rope, when some layer reads its own table.
    local: Option<Rope>,
    rotary_dims: usize,
}

fn tables(b: &dyn ComputeBackend, rope: &Rope, head_dim: usize, positions: usize) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let freqs = rope.frequencies(head_dim);
    let n = positions.checked_mul(half).filter(|&n| n <= isize::MAX as usize / 8).ok_or_else(|| {
        Error::value("RopeTables", "positions", "a table that fits in memory", format!("{positions} × {half}"))
    })?;
    let mut cos = Vec::new();
    let mut sin = Vec::new();
    for v in [&mut cos, &mut sin] {
        v.try_reserve_exact(n).map_err(|_| {
            Error::value("RopeTables", "positions", "memory for the rope tables", format!("{positions} × {half}"))
        })?;
    }
    // YaRN scales cos and sin (so q·k by its square); 1 for every other rope.
    let scale = rope.attention_factor();
    for p in 0..positions {
        for f in &freqs {
            let angle = p as f64 * f;
            cos.push((angle.cos() * scale) as f32);
            sin.push((angle.sin() * scale) as f32);
        }
    }
    Ok((b.upload(&Tensor::from_vec(cos, [positions, half])?)?, b.upload(&Tensor::from_vec(sin, [positions, half])?)?))
}

impl RopeTables {
    /// The tables of `arch` for positions `0..positions` (none for learned positions).
    pub fn new(b: &dyn ComputeBackend, arch: &Arch, positions: usize) -> Result<RopeTables> {
        let layer_local: Vec<bool> =
            arch.layer_attention.iter().map(|a| *a == LayerAttention::Local && arch.rope_local.is_some()).collect();
        if arch.positions != Positions::Rope {
            return Ok(RopeTables { global: None, local: None, layer_local, source: None });
        }
        let local = arch.rope_local.clone().filter(|_| layer_local.contains(&true));
        let mut t = RopeTables {
            global: None,
            local: None,
            layer_local,
            source: Some(RopeSource { global: arch.rope.clone(), local, rotary_dims: arch.rotary_dims() }),
        };
        t.compute(b, positions)?;
        Ok(t)
    }

    /// (Re)computes the tables for positions `0..positions`.
    fn compute(&mut self, b: &dyn ComputeBackend, positions: usize) -> Result<()> {
        if let Some(s) = &self.source {
            self.global = Some(tables(b, &s.global, s.rotary_dims, positions)?);
            self.local = s.local.as_ref().map(|r| tables(b, r, s.rotary_dims, positions)).transpose()?;
        }
        Ok(())
    }

    /// Positions the tables cover (`usize::MAX` for learned positions: no table).
    fn positions(&self) -> usize {
        self.global.as_ref().map_or(usize::MAX, |(cos, _)| cos.dims()[0])
    }

    /// Whether layer `l` reads the local table (its own rope base).
    pub(crate) fn is_local(&self, l: usize) -> bool {
        self.layer_local.get(l).copied().unwrap_or(false) && self.local.is_some()
    }

    /// `(cos, sin)` of layer `l`.
    pub fn of(&self, l: usize) -> Result<(&Tensor, &Tensor)> {
        let t = if self.layer_local.get(l).copied().unwrap_or(false) { &self.local } else { &self.global };
        t.as_ref()
            .map(|(c, s)| (c, s))
            .ok_or_else(|| Error::value("RopeTables::of", "layer", "a layer with rotary positions", l))
    }
}

/// What a linear-attention layer carries from one token to the next: the last `K − 1`
/// inputs of its causal convolution and the delta rule's state. A pass at position 0
/// starts from zero and never reads them, so clearing a cache needs no reset.
#[derive(Debug)]
pub struct LinearState {
    /// The convolution's previous inputs, `[1, C, K − 1]` f32.
    pub conv: Tensor,
    /// The delta rule's state, `[1, Hv, dk, dv]` f32.
    pub delta: Tensor,
}

/// Positions by which a cache's keys and values are backed: the backing is a whole
/// number of blocks (or the capacity).
pub const KV_BLOCK: usize = 256;

/// Per-layer key and value caches `[1, Hkv, backed, hd]`, how much is filled, and the
/// rotary tables for positions `0..backed`, where `backed` (≤ `capacity`, see
/// [`backed`](Self::backed)) grows as positions are written. The caches' dtype (F32,
/// F16 or BF16) is their storage format: new keys and values (f32) are rounded to it as
/// they are written, and attention reads it back as f32. A linear-attention layer has
/// empty key and value caches (`[1, 0, 0, hd]`) and its [`LinearState`] instead.
#[derive(Debug)]
pub struct KvCache {
    /// Keys per layer, `[1, Hkv, backed, hd]`.
    pub k: Vec<Tensor>,
    /// Values per layer, `[1, Hkv, backed, hd]`.
    pub v: Vec<Tensor>,
    /// Per layer, the state of a linear-attention layer (`None` for the others).
    pub linear: Vec<Option<LinearState>>,
    /// Positions filled so far.
    pub len: usize,
    /// Positions the cache may hold (`--ctx-size`).
    pub capacity: usize,
    /// Rotary tables for positions `0..backed` (at least).
    pub rope: RopeTables,
    /// Positions the key and value tensors are allocated for.
    backed: usize,
}

impl KvCache {
    /// Forgets the cached positions (keeps the allocation).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Positions the keys and values are allocated for (`len ≤ backed ≤ capacity`).
    pub fn backed(&self) -> usize {
        self.backed
    }

    /// Bytes of key and value tensors allocated (what the cache holds in memory beyond
    /// its rope tables and linear states).
    pub fn backed_bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|t| t.dtype().storage_bytes(t.elem_count())).sum()
    }

    /// Forgets every position and gives back the backing beyond the first block (a
    /// server slot between sequences).
    pub fn release(&mut self, b: &dyn ComputeBackend) -> Result<()> {
        self.len = 0;
        let backed = self.capacity.min(KV_BLOCK);
        if self.backed > backed {
            self.rebacked(b, backed, 0)?;
        }
        Ok(())
    }

    /// Moves the keys and values to tensors of `backed` positions with the first `keep`
    /// copied, and extends the rope tables to match; nothing changes on an error.
    fn rebacked(&mut self, b: &dyn ComputeBackend, backed: usize, keep: usize) -> Result<()> {
        let moved = |t: &Tensor| -> Result<Tensor> {
            let d = t.dims();
            if d[1] == 0 {
                return Ok(t.clone());
            }
            let mut wider = b.zeros(&Shape::new([d[0], d[1], backed, d[3]]), t.dtype())?;
            if keep > 0 {
                b.write_head_cache(&mut wider, &b.slice(t, 2, 0, keep)?, 0)?;
            }
            Ok(wider)
        };
        let k = self.k.iter().map(moved).collect::<Result<Vec<_>>>()?;
        let v = self.v.iter().map(moved).collect::<Result<Vec<_>>>()?;
        let mut rope = self.rope.clone();
        if rope.positions() != backed {
            rope.compute(b, backed)?;
        }
        (self.k, self.v, self.rope, self.backed) = (k, v, rope, backed);
        Ok(())
    }

    /// Makes positions `0..positions` writable: when they are more than the backing, the
    /// keys and values move to tensors of `max(positions, 1.5 × backed)` positions
    /// rounded up to [`KV_BLOCK`] (at most the capacity), the filled positions copied bit
    /// for bit, and the rope tables are extended to match. Error if `positions` exceeds
    /// the capacity.
    pub fn reserve(&mut self, b: &dyn ComputeBackend, positions: usize) -> Result<()> {
        const OP: &str = "KvCache::reserve";
        if positions > self.capacity {
            return Err(Error::value(
                OP,
                "positions",
                format!("at most {} (the cache size, --ctx-size)", self.capacity),
                positions,
            ));
        }
        if positions <= self.backed {
            return Ok(());
        }
        let grown = positions.max(self.backed + self.backed / 2);
        let backed = grown.div_ceil(KV_BLOCK).saturating_mul(KV_BLOCK).min(self.capacity);
        self.rebacked(b, backed, self.len.min(self.backed))
    }

    /// The dtype the keys and values are stored in (F32 for a model without layers).
    pub fn dtype(&self) -> DType {
        self.k.first().map_or(DType::F32, Tensor::dtype)
    }

    /// Bytes of keys and values one cached position takes over every layer (what a
    /// decode step reads per position of context).
    pub fn bytes_per_position(&self) -> usize {
        let per_layer = |t: &Tensor| t.dims().get(1..).map_or(0, |d| d[0] * d[2]) * t.dtype().storage_bytes(1);
        self.k.iter().chain(&self.v).map(per_layer).sum()
    }

    /// Whether some layer carries a [`LinearState`]: such a cache holds the state after
    /// its last position only, so it cannot be cut back to a shorter prefix (see
    /// [`truncate`](Self::truncate)).
    pub fn has_linear_state(&self) -> bool {
        self.linear.iter().any(Option::is_some)
    }

    /// Keeps the first `len` positions and forgets the rest (the next pass runs at
    /// position `len`). Keys and values need nothing more; a linear-attention state
    /// summarises every position, so a cache with one can only keep all of them or none.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        const OP: &str = "KvCache::truncate";
        if len > self.len {
            return Err(Error::value(OP, "len", format!("≤ the {} cached positions", self.len), len));
        }
        if len != 0 && len != self.len && self.has_linear_state() {
            return Err(Error::value(
                OP,
                "len",
                format!("0 or all {} positions (a linear-attention state cannot be cut back)", self.len),
                len,
            ));
        }
        self.len = len;
        Ok(())
    }

    /// Copies of the keys and values of positions `start..end` of every layer, as host
    /// tensors `[1, Hkv, end − start, hd]` in the cache's dtype (a layer without keys
    /// and values — linear attention, or not in this process's stage — gives an empty
    /// `[1, 0, end − start, hd]`). [`write_positions`](Self::write_positions) puts them
    /// back, bit for bit.
    pub fn read_positions(
        &self,
        b: &dyn ComputeBackend,
        start: usize,
        end: usize,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        const OP: &str = "KvCache::read_positions";
        if start > end || end > self.len {
            return Err(Error::value(
                OP,
                "range",
                format!("within the {} cached positions", self.len),
                format!("{start}..{end}"),
            ));
        }
        let read = |t: &Tensor| -> Result<Tensor> {
            let d = t.dims();
            let (heads, capacity, hd) = (d[1], d[2], d[3]);
            let shape = [1, heads, end - start, hd];
            if heads == 0 {
                return Tensor::from_bytes(&[], shape, t.dtype());
            }
            // `[1, H, capacity, hd]` row-major: head h's position p starts at row h·capacity + p.
            let row = t.dtype().storage_bytes(hd);
            let host = b.to_host(t)?;
            let bytes = host.host_bytes()?;
            let mut out = Vec::with_capacity(heads * (end - start) * row);
            for h in 0..heads {
                out.extend_from_slice(&bytes[(h * capacity + start) * row..(h * capacity + end) * row]);
            }
            Tensor::from_bytes(&out, shape, t.dtype())
        };
        Ok((self.k.iter().map(read).collect::<Result<_>>()?, self.v.iter().map(read).collect::<Result<_>>()?))
    }

    /// Writes keys and values read by [`read_positions`](Self::read_positions) (from a
    /// cache of the same model and dtype) at positions `pos ..`, leaving
    /// [`len`](Self::len) alone: the caller sets it once every position below it holds
    /// what it should.
    pub fn write_positions(&mut self, b: &dyn ComputeBackend, pos: usize, k: &[Tensor], v: &[Tensor]) -> Result<()> {
        const OP: &str = "KvCache::write_positions";
        if k.len() != self.k.len() || v.len() != self.v.len() {
            return Err(Error::value(OP, "layers", self.k.len(), format!("{} and {}", k.len(), v.len())));
        }
        let t = k.iter().chain(v).map(|x| x.dims().get(2).copied().unwrap_or(0)).max().unwrap_or(0);
        self.reserve(b, pos + t)?;
        for (cache, new) in self.k.iter_mut().zip(k).chain(self.v.iter_mut().zip(v)) {
            if cache.dims()[1] != 0 {
                b.write_head_cache(cache, new, pos)?;
            }
        }
        Ok(())
    }

    /// Fresh copies of the linear-attention states (`None` for the other layers): the
    /// state after the last cached position, for [`set_linear_states`](Self::set_linear_states).
    pub fn copy_linear_states(&self, b: &dyn ComputeBackend) -> Result<Vec<Option<LinearState>>> {
        self.linear
            .iter()
            .map(|s| match s {
                Some(s) => Ok(Some(LinearState { conv: b.copy(&s.conv)?, delta: b.copy(&s.delta)? })),
                None => Ok(None),
            })
            .collect()
    }

    /// Replaces the linear-attention states with fresh copies of `states` (from
    /// [`copy_linear_states`](Self::copy_linear_states) of the same model, taken after
    /// the position this cache's [`len`](Self::len) will be set to).
    pub fn set_linear_states(&mut self, b: &dyn ComputeBackend, states: &[Option<LinearState>]) -> Result<()> {
        const OP: &str = "KvCache::set_linear_states";
        if states.len() != self.linear.len() {
            return Err(Error::value(OP, "layers", self.linear.len(), states.len()));
        }
        for (l, (mine, theirs)) in self.linear.iter_mut().zip(states).enumerate() {
            match (mine, theirs) {
                // Copies, uniquely owned: the decode step updates the state in place.
                (Some(m), Some(t)) => {
                    *m = LinearState { conv: b.copy(&b.upload(&t.conv)?)?, delta: b.copy(&b.upload(&t.delta)?)? }
                }
                (None, None) => {}
                _ => {
                    return Err(Error::value(
                        OP,
                        "states",
                        "a linear state where the cache has one",
                        format!("layer {l}"),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// Bytes of keys and values per position of `arch` with caches of `dtype`: every
/// softmax-attention layer's K and V, `kv_dim` elements each.
pub fn kv_bytes_per_position(arch: &Arch, dtype: DType) -> u128 {
    (arch.attention_layers() as u128) * 2 * (arch.kv_dim() as u128) * (dtype.storage_bytes(1) as u128)
}

/// Bytes of the linear-attention layers' states (f32), whatever the context.
pub fn linear_state_bytes(arch: &Arch) -> u128 {
    let Some(la) = &arch.linear_attention else { return 0 };
    let per_layer = la.conv_channels() as u128 * (la.conv_kernel as u128 - 1)
        + la.v_heads as u128 * la.k_dim as u128 * la.v_dim as u128;
    (arch.n_layers - arch.attention_layers()) as u128 * per_layer * 4
}

impl Transformer {
    /// F32 caches for one stream of `capacity` positions (1 ..= the context length),
    /// backed as they fill (see the module docs); the full size is checked against
    /// memory first. See [`new_cache_of`](Self::new_cache_of) for 16-bit caches.
    pub fn new_cache(&self, b: &dyn ComputeBackend, capacity: usize) -> Result<KvCache> {
        self.new_cache_of(b, capacity, DType::F32)
    }

    /// Caches stored in `dtype` (F32, F16 or BF16: a 16-bit cache takes half the memory
    /// and half the bytes a decode step reads per position) for one stream of
    /// `capacity` positions (1 ..= the context length), backed as they fill (see the
    /// module docs); the full size is checked against memory first.
    pub fn new_cache_of(&self, b: &dyn ComputeBackend, capacity: usize, dtype: DType) -> Result<KvCache> {
        const OP: &str = "Transformer::new_cache";
        let arch = &self.arch;
        if !fusebox::spec::attention::CACHE_DTYPES.contains(&dtype) {
            return Err(Error::dtype(OP, "cache dtype", "f32, f16 or bf16", dtype));
        }
        if capacity == 0 || capacity > arch.context_length {
            return Err(Error::value(
                OP,
                "context size",
                format!("1..={} (the model's context length)", arch.context_length),
                capacity,
            ));
        }
        // K and V for every attention layer this process holds, the linear layers'
        // states, and up to two pairs of f32 rope tables.
        let held = &self.stage().layers;
        let share = |bytes: u128| bytes * held.len() as u128 / arch.n_layers.max(1) as u128;
        let need = share(kv_bytes_per_position(arch, dtype)) * (capacity as u128)
            + share(linear_state_bytes(arch))
            + 4 * (capacity as u128) * (arch.rotary_dims() as u128 / 2) * 4;
        let too_big = |limit: String| {
            Error::value(
                OP,
                "context size",
                format!(
                    "a KV cache that fits {limit} ({} layers × 2 × {} kv dims × {dtype} per position)",
                    arch.n_layers,
                    arch.kv_dim()
                ),
                format!("{capacity} positions needing {need} bytes"),
            )
        };
        if need > isize::MAX as u128 {
            return Err(too_big("in memory".into()));
        }
        if let Some(total) = physical_memory().filter(|&t| need > u128::from(t)) {
            return Err(too_big(format!("in this machine's {total} bytes of memory")));
        }
        let backed = capacity.min(KV_BLOCK);
        let shape = Shape::new([1, arch.n_kv_heads, backed, arch.head_dim]);
        let empty = Shape::new([1, 0, 0, arch.head_dim]);
        let alloc = || -> Result<Vec<Tensor>> {
            (0..arch.n_layers)
                .map(|l| b.zeros(if arch.is_linear(l) || !held.contains(&l) { &empty } else { &shape }, dtype))
                .collect()
        };
        let linear = (0..arch.n_layers)
            .map(|l| match (&arch.linear_attention, arch.is_linear(l) && held.contains(&l)) {
                (Some(la), true) => Ok(Some(LinearState {
                    conv: b.zeros(&Shape::new([1, la.conv_channels(), la.conv_kernel - 1]), DType::F32)?,
                    delta: b.zeros(&Shape::new([1, la.v_heads, la.k_dim, la.v_dim]), DType::F32)?,
                })),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let rope = RopeTables::new(b, arch, backed)?;
        Ok(KvCache { k: alloc()?, v: alloc()?, linear, len: 0, capacity, rope, backed })
    }
}

/// Physical memory in bytes (`MemTotal` of `/proc/meminfo`), where the system says.
pub(crate) fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
