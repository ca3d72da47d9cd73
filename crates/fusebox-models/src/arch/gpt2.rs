//! GPT-2: LayerNorm, tanh GELU MLP (`c_fc` / `c_proj`), learned positions, biases on
//! every projection, tied head. HF stores its `Conv1D` weights `[in, out]` (transposed
//! at load) and q, k, v in one `c_attn`.

use fusebox::{Error, Result, RopeStyle};

use super::preset::{ModelConfig, Preset};
use super::{Architecture, Fix, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts, NameTable};
use crate::transformer::{Arch, Biases, LayerAttention, Mlp, NormKind, Positions, Rope, Stacking};

/// GPT-2.
pub struct Gpt2;

/// GPT-2's HF names (some exports prefix each with `transformer.`).
pub static HF_NAMES: NameTable = NameTable {
    layer_prefix: "h.",
    layer: &[
        ("norm1.weight", "ln_1.weight", Fix::None),
        ("norm1.bias", "ln_1.bias", Fix::None),
        ("attn.qkv.weight", "attn.c_attn.weight", Fix::Transpose),
        ("attn.qkv.bias", "attn.c_attn.bias", Fix::None),
        ("attn.o.weight", "attn.c_proj.weight", Fix::Transpose),
        ("attn.o.bias", "attn.c_proj.bias", Fix::None),
        ("norm2.weight", "ln_2.weight", Fix::None),
        ("norm2.bias", "ln_2.bias", Fix::None),
        ("mlp.fc.weight", "mlp.c_fc.weight", Fix::Transpose),
        ("mlp.fc.bias", "mlp.c_fc.bias", Fix::None),
        ("mlp.proj.weight", "mlp.c_proj.weight", Fix::Transpose),
        ("mlp.proj.bias", "mlp.c_proj.bias", Fix::None),
    ],
    global: &[
        ("wte", "wte.weight", Fix::None),
        ("wpe", "wpe.weight", Fix::None),
        ("norm_f.weight", "ln_f.weight", Fix::None),
        ("norm_f.bias", "ln_f.bias", Fix::None),
    ],
    extends: None,
};

static HF: HfFacts = HfFacts {
    model_type: "gpt2",
    class: "GPT2LMHeadModel",
    names: &HF_NAMES,
    stacking: Stacking { qkv: true, gate_up: false },
    ignored,
    export_prefix: "transformer.",
};

/// llama.cpp stores weights `[out, in]` and q/k/v in `attn_qkv`.
static GGUF: GgufFacts = GgufFacts { stacking: Stacking { qkv: true, gate_up: false }, ..GgufFacts::named("gpt2") };

/// Trained from scratch: the GPT-2 block with the config's head and rope settings (so
/// a config that asks for fewer key/value heads is refused by name); 4 key/value heads
/// (every query head's own) and a 4× MLP of 512 in [`ModelConfig::tiny`].
pub static PRESET: Preset = Preset {
    block: |cfg| Arch {
        rope: Rope::plain(f64::from(cfg.rope_theta), RopeStyle::HalfSplit),
        tied_embeddings: cfg.tied_embeddings,
        moe: None,
        ..gpt2(cfg.vocab_size, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.max_seq, cfg.norm_eps)
    },
    tiny_kv_heads: 4,
    tiny_d_ff: 512,
};

/// GPT-2 124M: vocab 50257, 12 layers, 12 heads, width 768, context 1024, tied embeddings.
pub fn config_124m() -> ModelConfig {
    ModelConfig {
        style: super::Style::Gpt2,
        vocab_size: 50257,
        n_layers: 12,
        n_heads: 12,
        n_kv_heads: 12,
        d_model: 768,
        d_ff: 3072,
        max_seq: 1024,
        norm_eps: 1e-5,
        rope_theta: 10000.0,
        tied_embeddings: true,
    }
}

fn gpt2(vocab_size: usize, n_layers: usize, d_model: usize, n_heads: usize, d_ff: usize, ctx: usize, eps: f32) -> Arch {
    Arch {
        name: "gpt2".into(),
        vocab_size,
        n_layers,
        d_model,
        n_heads,
        n_kv_heads: n_heads,
        head_dim: d_model.checked_div(n_heads).unwrap_or(0),
        d_ff,
        context_length: ctx,
        norm: NormKind::LayerNorm,
        norm_eps: eps,
        post_norms: false,
        qk_norm: false,
        qk_norm_whole: false,
        mlp: Mlp::Gelu,
        positions: Positions::Learned,
        rope: Rope::plain(10_000.0, RopeStyle::HalfSplit),
        rope_local: None,
        sliding_window: None,
        layer_attention: vec![LayerAttention::Global; n_layers],
        bias: Biases { qkv: true, o: true, mlp: true, experts: false },
        attn_scale: if n_heads > 0 && d_model >= n_heads { 1.0 / ((d_model / n_heads) as f32).sqrt() } else { 1.0 },
        embed_scale: 1.0,
        tied_embeddings: true,
        attn_sinks: false,
        moe: None,
        linear_attention: None,
        attn_output_gate: false,
        rotary_dim: None,
    }
}

/// The causal-mask buffers older exports keep (the mask is implicit here), and the
/// copy of the tied head some exports write.
fn ignored(name: &str) -> bool {
    name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name == "lm_head.weight"
}

impl Architecture for Gpt2 {
    fn name(&self) -> &'static str {
        "gpt2"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let act = c.string("activation_function")?.unwrap_or("gelu_new");
        if !matches!(act, "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") {
            return Err(Error::unsupported(
                "config.json",
                format!("GPT-2 activation_function '{act}' (only the tanh GELU forms: gelu_new, gelu_pytorch_tanh)"),
            ));
        }
        for (option, ok) in [("scale_attn_by_inverse_layer_idx", false), ("scale_attn_weights", true)] {
            if c.flag(option)?.is_some_and(|v| v != ok) {
                return Err(Error::unsupported("config.json", format!("GPT-2 {option} = {}", !ok)));
            }
        }
        let d_model = c.size("n_embd")?;
        let n_heads = c.size("n_head")?;
        if !d_model.is_multiple_of(n_heads) {
            return Err(Error::value("config.json", "'n_head'", format!("a divisor of n_embd {d_model}"), n_heads));
        }
        let ctx = match c.uint("n_positions")? {
            Some(n) => n,
            None => c.size("n_ctx")?,
        };
        let arch = gpt2(
            c.size("vocab_size")?,
            c.layers("n_layer")?,
            d_model,
            n_heads,
            c.uint("n_inner")?.unwrap_or(4 * d_model),
            ctx,
            c.float("layer_norm_epsilon")?.unwrap_or(1e-5) as f32,
        );
        Ok(arch)
    }

    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let d_model = k.size("embedding_length")?;
        let n_heads = k.size("attention.head_count")?;
        if !d_model.is_multiple_of(n_heads) {
            return Err(Error::value(
                "gguf",
                format!("metadata '{}'", k.key("attention.head_count")),
                format!("a divisor of {d_model}"),
                n_heads,
            ));
        }
        let vocab = match k.opt_size("vocab_size")? {
            Some(v) => v,
            None => k
                .vocab_from_tokens
                .filter(|&n| n > 0)
                .ok_or_else(|| Error::Io(format!("gguf: no {} and no tokenizer.ggml.tokens", k.key("vocab_size"))))?,
        };
        Ok(gpt2(
            vocab,
            k.layers()?,
            d_model,
            n_heads,
            k.size("feed_forward_length")?,
            k.size("context_length")?,
            k.require_float("attention.layer_norm_epsilon")? as f32,
        ))
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.set("n_embd", arch.d_model.into());
        c.set("n_head", arch.n_heads.into());
        c.set("n_layer", arch.n_layers.into());
        c.set("n_positions", arch.context_length.into());
        c.set("n_ctx", arch.context_length.into());
        c.set("n_inner", arch.d_ff.into());
        c.set("layer_norm_epsilon", super::hf::json_f32(arch.norm_eps));
        c.set("activation_function", "gelu_new".into());
        c.set("scale_attn_weights", true.into());
        c.set("scale_attn_by_inverse_layer_idx", false.into());
        c.set("reorder_and_upcast_attn", false.into());
        for k in ["attn_pdrop", "embd_pdrop", "resid_pdrop"] {
            c.set(k, 0.0.into());
        }
        Ok(())
    }

    /// llama.cpp's GPT-2 has one head count (no `head_count_kv`).
    fn write_gguf(&self, _: &Arch, _: &mut GgufMetaOut) -> Result<()> {
        Ok(())
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}
