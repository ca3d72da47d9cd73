//! [`Arch`] ↔ `arch.json`: the one transformer's description as a fine-tuning
//! checkpoint records it, so the checkpoint is read without its base file.

use fusebox::{Error, Result, RopeStyle};
use serde_json::{json, Value};

use crate::transformer::{Arch, Biases, LayerAttention, Mlp, NormKind, Positions, Rope, RopeScaling};

fn rope_to_json(r: &Rope) -> Value {
    let scaling = match &r.scaling {
        RopeScaling::None => json!({"type": "none"}),
        RopeScaling::Linear { factor } => json!({"type": "linear", "factor": factor}),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => json!({
            "type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor, "original_max_positions": original_max_positions,
        }),
        RopeScaling::FreqFactors(f) => json!({"type": "freq_factors", "factors": f}),
    };
    let style = match r.style {
        RopeStyle::HalfSplit => "half_split",
        RopeStyle::Interleaved => "interleaved",
    };
    json!({"theta": r.theta, "scaling": scaling, "style": style})
}

/// `arch` as JSON (every field, names as in [`Arch`]).
pub fn to_json(a: &Arch) -> Value {
    json!({
        "name": a.name,
        "vocab_size": a.vocab_size,
        "n_layers": a.n_layers,
        "d_model": a.d_model,
        "n_heads": a.n_heads,
        "n_kv_heads": a.n_kv_heads,
        "head_dim": a.head_dim,
        "d_ff": a.d_ff,
        "context_length": a.context_length,
        "norm": match a.norm { NormKind::LayerNorm => "layer_norm", NormKind::Rms => "rms" },
        "norm_eps": a.norm_eps,
        "post_norms": a.post_norms,
        "qk_norm": a.qk_norm,
        "mlp": match a.mlp { Mlp::Gelu => "gelu", Mlp::SwiGlu => "swiglu", Mlp::GeGlu => "geglu" },
        "positions": match a.positions { Positions::Learned => "learned", Positions::Rope => "rope" },
        "rope": rope_to_json(&a.rope),
        "rope_local": a.rope_local.as_ref().map(rope_to_json),
        "sliding_window": a.sliding_window,
        "layer_attention": a.layer_attention.iter().map(|l| match l {
            LayerAttention::Global => "global",
            LayerAttention::Local => "local",
        }).collect::<Vec<_>>(),
        "bias": {"qkv": a.bias.qkv, "o": a.bias.o, "mlp": a.bias.mlp},
        "attn_scale": a.attn_scale,
        "embed_scale": a.embed_scale,
        "tied_embeddings": a.tied_embeddings,
    })
}

struct Reader<'a> {
    v: &'a Value,
    at: String,
}

impl Reader<'_> {
    fn bad(&self, field: &str, expected: &str) -> Error {
        Error::Io(format!("arch.json: '{}{field}': expected {expected}", self.at))
    }
    fn get(&self, field: &str) -> Result<&Value> {
        self.v.get(field).ok_or_else(|| Error::Io(format!("arch.json: no '{}{field}'", self.at)))
    }
    fn size(&self, field: &str) -> Result<usize> {
        self.get(field)?
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.bad(field, "a non-negative integer"))
    }
    fn f64(&self, field: &str) -> Result<f64> {
        self.get(field)?.as_f64().ok_or_else(|| self.bad(field, "a number"))
    }
    fn f32(&self, field: &str) -> Result<f32> {
        Ok(self.f64(field)? as f32)
    }
    fn bool(&self, field: &str) -> Result<bool> {
        self.get(field)?.as_bool().ok_or_else(|| self.bad(field, "true or false"))
    }
    fn str(&self, field: &str) -> Result<&str> {
        self.get(field)?.as_str().ok_or_else(|| self.bad(field, "a string"))
    }
    fn pick<T: Copy>(&self, field: &str, options: &[(&str, T)]) -> Result<T> {
        let s = self.str(field)?;
        options.iter().find(|(n, _)| *n == s).map(|(_, t)| *t).ok_or_else(|| {
            self.bad(field, &format!("one of {}", options.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")))
        })
    }
    fn sub<'b>(&'b self, field: &str) -> Result<Reader<'b>> {
        Ok(Reader { v: self.get(field)?, at: format!("{}{field}.", self.at) })
    }
}

fn rope_from(r: &Reader<'_>) -> Result<Rope> {
    let s = r.sub("scaling")?;
    let scaling = match s.str("type")? {
        "none" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: s.f64("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: s.f64("factor")?,
            low_freq_factor: s.f64("low_freq_factor")?,
            high_freq_factor: s.f64("high_freq_factor")?,
            original_max_positions: s.f64("original_max_positions")?,
        },
        "freq_factors" => RopeScaling::FreqFactors(
            s.get("factors")?
                .as_array()
                .ok_or_else(|| s.bad("factors", "a list of numbers"))?
                .iter()
                .map(|x| x.as_f64().map(|x| x as f32).ok_or_else(|| s.bad("factors", "a list of numbers")))
                .collect::<Result<_>>()?,
        ),
        _ => return Err(s.bad("type", "none, linear, llama3 or freq_factors")),
    };
    let style = r.pick("style", &[("half_split", RopeStyle::HalfSplit), ("interleaved", RopeStyle::Interleaved)])?;
    Ok(Rope { theta: r.f64("theta")?, scaling, style })
}

/// Reads what [`to_json`] wrote, and validates it ([`Arch::validate`]); every error
/// names the field.
pub fn from_json(v: &Value) -> Result<Arch> {
    let r = Reader { v, at: String::new() };
    let rope_local = match r.get("rope_local")? {
        Value::Null => None,
        _ => Some(rope_from(&r.sub("rope_local")?)?),
    };
    let sliding_window = match r.get("sliding_window")? {
        Value::Null => None,
        _ => Some(r.size("sliding_window")?),
    };
    let layer_attention = r
        .get("layer_attention")?
        .as_array()
        .ok_or_else(|| r.bad("layer_attention", "a list"))?
        .iter()
        .map(|l| match l.as_str() {
            Some("global") => Ok(LayerAttention::Global),
            Some("local") => Ok(LayerAttention::Local),
            _ => Err(r.bad("layer_attention", "a list of \"global\" / \"local\"")),
        })
        .collect::<Result<_>>()?;
    let bias = r.sub("bias")?;
    let arch = Arch {
        name: r.str("name")?.to_string(),
        vocab_size: r.size("vocab_size")?,
        n_layers: r.size("n_layers")?,
        d_model: r.size("d_model")?,
        n_heads: r.size("n_heads")?,
        n_kv_heads: r.size("n_kv_heads")?,
        head_dim: r.size("head_dim")?,
        d_ff: r.size("d_ff")?,
        context_length: r.size("context_length")?,
        norm: r.pick("norm", &[("layer_norm", NormKind::LayerNorm), ("rms", NormKind::Rms)])?,
        norm_eps: r.f32("norm_eps")?,
        post_norms: r.bool("post_norms")?,
        qk_norm: r.bool("qk_norm")?,
        mlp: r.pick("mlp", &[("gelu", Mlp::Gelu), ("swiglu", Mlp::SwiGlu), ("geglu", Mlp::GeGlu)])?,
        positions: r.pick("positions", &[("learned", Positions::Learned), ("rope", Positions::Rope)])?,
        rope: rope_from(&r.sub("rope")?)?,
        rope_local,
        sliding_window,
        layer_attention,
        bias: Biases { qkv: bias.bool("qkv")?, o: bias.bool("o")?, mlp: bias.bool("mlp")? },
        attn_scale: r.f32("attn_scale")?,
        embed_scale: r.f32("embed_scale")?,
        tied_embeddings: r.bool("tied_embeddings")?,
    };
    arch.validate().map_err(|e| Error::Io(format!("arch.json: {e}")))?;
    Ok(arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips_and_bad_fields_are_named() {
        let cfg = crate::config::ModelConfig::tiny(crate::config::Style::Gemma3, 40, 32);
        let mut arch = crate::model::arch_of(&cfg);
        arch.rope.scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_positions: 16.0,
        };
        let factors = (0..arch.head_dim / 2).map(|i| 1.0 + i as f32 / 4.0).collect();
        arch.rope_local =
            Some(Rope { theta: 10.0, scaling: RopeScaling::FreqFactors(factors), style: RopeStyle::Interleaved });
        assert_eq!(from_json(&to_json(&arch)).unwrap(), arch);
        let mut v = to_json(&arch);
        v["mlp"] = json!("relu");
        assert!(from_json(&v).unwrap_err().to_string().contains("'mlp'"));
        let mut v = to_json(&arch);
        v["rope"]["scaling"]["factor"] = json!("big");
        assert!(from_json(&v).unwrap_err().to_string().contains("'rope.scaling.factor'"));
        let mut v = to_json(&arch);
        v.as_object_mut().unwrap().remove("d_ff");
        assert!(from_json(&v).unwrap_err().to_string().contains("'d_ff'"));
    }
}
