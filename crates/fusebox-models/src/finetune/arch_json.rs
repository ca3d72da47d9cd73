//! [`Arch`] ↔ `arch.json`: the one transformer's description as a fine-tuning
//! checkpoint records it, so the checkpoint is read without its base file. The format
//! is [`Arch`]'s own serde form ([`Arch::to_json`]); these name the file in errors.

use fusebox::Result;
use serde_json::Value;

use crate::transformer::Arch;

/// `arch` as JSON (every field, names as in [`Arch`]).
pub fn to_json(a: &Arch) -> Value {
    a.to_json()
}

/// Reads what [`to_json`] wrote, and validates it ([`Arch::validate`]); every error
/// names the field.
pub fn from_json(v: &Value) -> Result<Arch> {
    Arch::from_json(v, "arch.json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelConfig, Style};
    use crate::transformer::{Rope, RopeScaling};
    use fusebox::RopeStyle;
    use serde_json::json;

    #[test]
    fn every_field_round_trips_and_bad_fields_are_named() {
        let mut arch = crate::model::arch_of(&ModelConfig::tiny(Style::Gemma3, 40, 32));
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

    /// A hybrid (Qwen3.5) description round-trips; linear layers without their sizes,
    /// or with sizes whose products overflow, are refused by name, not a panic.
    #[test]
    fn hybrid_arch_round_trips_and_bad_linear_sizes_are_named() {
        let arch = crate::model::arch_of(&ModelConfig::tiny(Style::parse("qwen3_5").unwrap(), 40, 32));
        assert!(arch.linear_attention.is_some() && arch.attn_output_gate && arch.rotary_dim.is_some());
        assert_eq!(from_json(&to_json(&arch)).unwrap(), arch);
        let mut v = to_json(&arch);
        v.as_object_mut().unwrap().remove("linear_attention");
        assert!(from_json(&v).unwrap_err().to_string().contains("linear_attention"));
        for (field, value) in [("v_heads", json!(3)), ("k_dim", json!(0)), ("v_dim", json!(1u64 << 40))] {
            let mut v = to_json(&arch);
            v["linear_attention"]["k_dim"] = json!(1u64 << 40);
            v["linear_attention"][field] = value;
            let e = from_json(&v).unwrap_err().to_string();
            assert!(e.contains("linear_attention"), "{field}: {e}");
        }
        let mut v = to_json(&arch);
        v["rotary_dim"] = json!(3);
        assert!(from_json(&v).unwrap_err().to_string().contains("rotary_dim"));
    }

    /// An `arch.json` as the hand-written writer before serde wrote it (a Llama 3
    /// rope, an interleaved GGUF base) reads as the same architecture.
    #[test]
    fn arch_json_of_earlier_versions_reads() {
        let v = json!({
            "name": "llama", "vocab_size": 49152, "n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 16, "d_ff": 128, "context_length": 256, "norm": "rms", "norm_eps": 0.0009765625,
            "post_norms": false, "qk_norm": false, "mlp": "swiglu", "positions": "rope",
            "rope": {"theta": 500000.0, "scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_positions": 8192.0}, "style": "interleaved"},
            "rope_local": null, "sliding_window": null, "layer_attention": ["global", "global"],
            "bias": {"qkv": false, "o": false, "mlp": false}, "attn_scale": 0.25, "embed_scale": 1.0,
            "tied_embeddings": true
        });
        let a = from_json(&v).unwrap();
        assert_eq!((a.n_layers, a.head_dim, a.rope.style), (2, 16, RopeStyle::Interleaved));
        assert!(matches!(a.rope.scaling, RopeScaling::Llama3 { factor: 8.0, .. }));
        assert_eq!(to_json(&a), v);
    }
}
