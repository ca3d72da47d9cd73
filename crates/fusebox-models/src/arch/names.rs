//! How files name fusebox's parameters: a [`NameTable`] maps fusebox's own names
//! (`h.{l}.attn.q.weight`, the same for every architecture) to a file's, with the
//! [`Fix`] a tensor needs on the way. llama.cpp names every architecture's tensors
//! alike ([`GGUF_NAMES`]); Hugging Face names the Llama family alike
//! ([`HF_LLAMA_NAMES`]) and the other architectures in their own files.

/// A change a file's tensor needs on its way to fusebox's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fix {
    /// As stored.
    None,
    /// Stored with its last two axes swapped (GPT-2's `Conv1D` `[in, out]`, gpt-oss's
    /// `down_proj` `[E, F, D]`): transposed to `[.., out, in]`.
    Transpose,
    /// A Gemma `(1 + w)` norm weight stored as `w`: 1 is added.
    PlusOne,
    /// Two parameters interleaved along the stored tensor's last axis (twice as long):
    /// this one is every second entry from `0` (gpt-oss's gate) or `1` (its up) —
    /// `gate_up_proj_bias` `[E, 2F]`.
    Interleaved(usize),
    /// [`Fix::Interleaved`] of a tensor stored transposed: `gate_up_proj` `[E, D, 2F]`
    /// holds the `[E, F, D]` gate (`0`) and up (`1`).
    InterleavedTransposed(usize),
    /// Two parameters stacked along the stored tensor's second-to-last axis (twice as
    /// long), one after the other within each leading index: this one is half `0` or `1`
    /// — transformers' fused `gate_up_proj` `[E, 2F, D]` holds, per expert, the `[F, D]`
    /// gate (`0`) and then the up (`1`).
    Half(usize),
    /// A depthwise convolution `[C, K]` stored as PyTorch's `Conv1d` weight `[C, 1, K]`
    /// (the same values).
    Depthwise,
}

impl Fix {
    /// The shape a file stores a parameter of shape `ours` in.
    pub fn stored_shape(self, ours: &[usize]) -> Vec<usize> {
        let mut s = ours.to_vec();
        let n = s.len();
        if matches!(self, Fix::Transpose | Fix::InterleavedTransposed(_)) && n >= 2 {
            s.swap(n - 2, n - 1);
        }
        if let (Fix::Interleaved(_) | Fix::InterleavedTransposed(_), Some(last)) = (self, s.last_mut()) {
            *last *= 2;
        }
        if matches!(self, Fix::Half(_)) && n >= 2 {
            s[n - 2] *= 2;
        }
        if self == Fix::Depthwise && n == 2 {
            s.insert(1, 1);
        }
        s
    }

    /// The parameter's values (shape `ours`) from the stored tensor's (`stored`, of
    /// shape [`stored_shape`](Self::stored_shape)).
    pub fn to_ours(self, ours: &[usize], stored: &[f32]) -> Vec<f32> {
        match self {
            Fix::None | Fix::Depthwise => stored.to_vec(),
            Fix::PlusOne => stored.iter().map(|w| w + 1.0).collect(),
            Fix::Transpose => swap_last_two(stored, &self.stored_shape(ours)),
            Fix::Interleaved(part) => stored.iter().skip(part).step_by(2).copied().collect(),
            Fix::InterleavedTransposed(part) => {
                let half: Vec<f32> = stored.iter().skip(part).step_by(2).copied().collect();
                swap_last_two(&half, &Fix::Transpose.stored_shape(ours))
            }
            Fix::Half(part) => {
                let block = half_block(ours);
                stored
                    .chunks_exact(2 * block)
                    .flat_map(|pair| &pair[part * block..(part + 1) * block])
                    .copied()
                    .collect()
            }
        }
    }

    /// The inverse of [`to_ours`](Self::to_ours): writes parameter `values` (shape `ours`)
    /// into `stored` (shape [`stored_shape`](Self::stored_shape)); an interleaved part
    /// fills only its own entries, so two parameters share one stored tensor.
    pub fn to_stored(self, ours: &[usize], values: &[f32], stored: &mut [f32]) {
        match self {
            Fix::None | Fix::Depthwise => stored.copy_from_slice(values),
            Fix::PlusOne => stored.iter_mut().zip(values).for_each(|(s, w)| *s = w - 1.0),
            Fix::Transpose => stored.copy_from_slice(&swap_last_two(values, ours)),
            Fix::Interleaved(part) => stored.iter_mut().skip(part).step_by(2).zip(values).for_each(|(s, v)| *s = *v),
            Fix::InterleavedTransposed(part) => {
                let t = swap_last_two(values, ours);
                stored.iter_mut().skip(part).step_by(2).zip(&t).for_each(|(s, v)| *s = *v);
            }
            Fix::Half(part) => {
                let block = half_block(ours);
                for (pair, v) in stored.chunks_exact_mut(2 * block).zip(values.chunks_exact(block)) {
                    pair[part * block..(part + 1) * block].copy_from_slice(v);
                }
            }
        }
    }
}

/// The elements of one half of a [`Fix::Half`] parameter of shape `ours` per leading
/// index (its last two axes, `F·D`; at least 1).
fn half_block(ours: &[usize]) -> usize {
    ours.iter().rev().take(2).product::<usize>().max(1)
}

/// `x` of shape `[.., r, c]` as `[.., c, r]`.
fn swap_last_two(x: &[f32], shape: &[usize]) -> Vec<f32> {
    let n = shape.len();
    let (rows, cols) = if n >= 2 { (shape[n - 2], shape[n - 1]) } else { (1, shape.first().copied().unwrap_or(1)) };
    let mut out = vec![0.0f32; x.len()];
    for (src, dst) in x.chunks_exact((rows * cols).max(1)).zip(out.chunks_exact_mut((rows * cols).max(1))) {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

/// How a file names fusebox's parameters: `(fusebox name, file name, fix)` pairs for
/// the per-layer tensors (after `h.{l}.` / `{layer_prefix}{l}.`) and the global ones.
#[derive(Debug)]
pub struct NameTable {
    /// The file's layer prefix (`model.layers.`, `blk.`, `h.`).
    pub layer_prefix: &'static str,
    /// Per-layer names.
    pub layer: &'static [(&'static str, &'static str, Fix)],
    /// Global names.
    pub global: &'static [(&'static str, &'static str, Fix)],
    /// The table this one adds to: names not found here are looked up there.
    pub extends: Option<&'static NameTable>,
}

impl NameTable {
    /// The file's name of fusebox parameter `name`, and its fix. Two parameters may name
    /// one file tensor, each its part ([`Fix::Interleaved`], [`Fix::Half`]). A name holding `{e}`
    /// stands for one file tensor per expert (`mlp.experts.{e}.gate_proj.weight`), stacked
    /// along a new first axis into the parameter.
    pub fn file_name(&self, name: &str) -> Option<(String, Fix)> {
        let own = if let Some(rest) = name.strip_prefix("h.") {
            let (l, part) = rest.split_once('.')?;
            self.layer
                .iter()
                .find(|(ours, _, _)| *ours == part)
                .map(|(_, file, fix)| (format!("{}{l}.{file}", self.layer_prefix), *fix))
        } else {
            self.global.iter().find(|(ours, _, _)| *ours == name).map(|(_, file, fix)| (file.to_string(), *fix))
        };
        own.or_else(|| self.extends?.file_name(name))
    }
}

/// The llama.cpp tensor names (`llama-arch.cpp`), the same for every architecture here.
pub static GGUF_NAMES: NameTable = NameTable {
    layer_prefix: "blk.",
    layer: &[
        ("norm1.weight", "attn_norm.weight", Fix::None),
        ("norm1.bias", "attn_norm.bias", Fix::None),
        ("attn.q.weight", "attn_q.weight", Fix::None),
        ("attn.q.bias", "attn_q.bias", Fix::None),
        ("attn.k.weight", "attn_k.weight", Fix::None),
        ("attn.k.bias", "attn_k.bias", Fix::None),
        ("attn.v.weight", "attn_v.weight", Fix::None),
        ("attn.v.bias", "attn_v.bias", Fix::None),
        ("attn.qkv.weight", "attn_qkv.weight", Fix::None),
        ("attn.qkv.bias", "attn_qkv.bias", Fix::None),
        ("attn.q_norm.weight", "attn_q_norm.weight", Fix::None),
        ("attn.k_norm.weight", "attn_k_norm.weight", Fix::None),
        ("attn.o.weight", "attn_output.weight", Fix::None),
        ("attn.o.bias", "attn_output.bias", Fix::None),
        ("post_attn_norm.weight", "post_attention_norm.weight", Fix::None),
        ("norm2.weight", "ffn_norm.weight", Fix::None),
        ("norm2.bias", "ffn_norm.bias", Fix::None),
        ("mlp.gate.weight", "ffn_gate.weight", Fix::None),
        ("mlp.up.weight", "ffn_up.weight", Fix::None),
        ("mlp.gate_up.weight", "ffn_up.weight", Fix::None),
        ("mlp.down.weight", "ffn_down.weight", Fix::None),
        ("mlp.fc.weight", "ffn_up.weight", Fix::None),
        ("mlp.fc.bias", "ffn_up.bias", Fix::None),
        ("mlp.proj.weight", "ffn_down.weight", Fix::None),
        ("mlp.proj.bias", "ffn_down.bias", Fix::None),
        ("post_mlp_norm.weight", "post_ffw_norm.weight", Fix::None),
        ("mlp.router.weight", "ffn_gate_inp.weight", Fix::None),
        ("mlp.experts.gate.weight", "ffn_gate_exps.weight", Fix::None),
        ("mlp.experts.up.weight", "ffn_up_exps.weight", Fix::None),
        ("mlp.experts.down.weight", "ffn_down_exps.weight", Fix::None),
        ("mlp.shared.gate.weight", "ffn_gate_shexp.weight", Fix::None),
        ("mlp.shared.up.weight", "ffn_up_shexp.weight", Fix::None),
        ("mlp.shared.down.weight", "ffn_down_shexp.weight", Fix::None),
        ("mlp.shared_gate.weight", "ffn_gate_inp_shexp.weight", Fix::None),
    ],
    global: &[
        ("wte", "token_embd.weight", Fix::None),
        ("wpe", "position_embd.weight", Fix::None),
        ("norm_f.weight", "output_norm.weight", Fix::None),
        ("norm_f.bias", "output_norm.bias", Fix::None),
        ("lm_head.weight", "output.weight", Fix::None),
    ],
    extends: None,
};

/// The HF names of the Llama family (`LlamaForCausalLM` and the models written as its diff).
pub static HF_LLAMA_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("norm1.weight", "input_layernorm.weight", Fix::None),
        ("attn.q.weight", "self_attn.q_proj.weight", Fix::None),
        ("attn.q.bias", "self_attn.q_proj.bias", Fix::None),
        ("attn.k.weight", "self_attn.k_proj.weight", Fix::None),
        ("attn.k.bias", "self_attn.k_proj.bias", Fix::None),
        ("attn.v.weight", "self_attn.v_proj.weight", Fix::None),
        ("attn.v.bias", "self_attn.v_proj.bias", Fix::None),
        ("attn.q_norm.weight", "self_attn.q_norm.weight", Fix::None),
        ("attn.k_norm.weight", "self_attn.k_norm.weight", Fix::None),
        ("attn.o.weight", "self_attn.o_proj.weight", Fix::None),
        ("attn.o.bias", "self_attn.o_proj.bias", Fix::None),
        ("norm2.weight", "post_attention_layernorm.weight", Fix::None),
        ("mlp.gate.weight", "mlp.gate_proj.weight", Fix::None),
        ("mlp.gate.bias", "mlp.gate_proj.bias", Fix::None),
        ("mlp.up.weight", "mlp.up_proj.weight", Fix::None),
        ("mlp.up.bias", "mlp.up_proj.bias", Fix::None),
        ("mlp.down.weight", "mlp.down_proj.weight", Fix::None),
        ("mlp.down.bias", "mlp.down_proj.bias", Fix::None),
    ],
    global: &[
        ("wte", "model.embed_tokens.weight", Fix::None),
        ("norm_f.weight", "model.norm.weight", Fix::None),
        ("lm_head.weight", "lm_head.weight", Fix::None),
    ],
    extends: None,
};

/// The HF names of the mixture-of-experts models written as Llama's diff with
/// `mlp.gate` the router and `mlp.experts.N.*_proj` the experts (Qwen3-MoE, OLMoE).
pub static HF_MOE_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("mlp.router.weight", "mlp.gate.weight", Fix::None),
        ("mlp.experts.gate.weight", "mlp.experts.{e}.gate_proj.weight", Fix::None),
        ("mlp.experts.up.weight", "mlp.experts.{e}.up_proj.weight", Fix::None),
        ("mlp.experts.down.weight", "mlp.experts.{e}.down_proj.weight", Fix::None),
        ("mlp.shared.gate.weight", "mlp.shared_expert.gate_proj.weight", Fix::None),
        ("mlp.shared.up.weight", "mlp.shared_expert.up_proj.weight", Fix::None),
        ("mlp.shared.down.weight", "mlp.shared_expert.down_proj.weight", Fix::None),
        ("mlp.shared_gate.weight", "mlp.shared_expert_gate.weight", Fix::None),
    ],
    global: &[],
    extends: Some(&HF_LLAMA_NAMES),
};

/// A derived buffer some HF exports keep (recomputed from the config here).
pub fn hf_derived(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_of_a_fused_tensor_are_each_experts_rows_in_turn() {
        // [E 2, 2F 4, D 1]: expert 0 gate rows 0 1, up 2 3; expert 1 gate 4 5, up 6 7.
        let stored: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let ours = [2, 2, 1];
        assert_eq!(Fix::Half(0).stored_shape(&ours), [2, 4, 1]);
        let gate = Fix::Half(0).to_ours(&ours, &stored);
        let up = Fix::Half(1).to_ours(&ours, &stored);
        assert_eq!(
            (gate.as_slice(), up.as_slice()),
            ([0.0, 1.0, 4.0, 5.0].as_slice(), [2.0, 3.0, 6.0, 7.0].as_slice())
        );
        let mut back = vec![0.0; 8];
        Fix::Half(0).to_stored(&ours, &gate, &mut back);
        Fix::Half(1).to_stored(&ours, &up, &mut back);
        assert_eq!(back, stored);
    }
}
