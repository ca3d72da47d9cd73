//! A multimodal wrapper checkpoint's tensors as its text model names them
//! ([`HfWrapper`]: Qwen3.5's `model.language_model.*` as `model.*`), the parts a
//! text-only run leaves out (the vision tower) hidden: the loader then reads it as it
//! reads the text model's own checkpoints, and finds no unexplained tensors.

use std::collections::BTreeMap;

use fusebox::{DType, Error, Result, Tensor};

use super::TensorSource;
use crate::arch::HfWrapper;

/// The text model's tensors of a wrapper checkpoint (see the module docs).
pub struct TextOnly<'a> {
    inner: &'a dyn TensorSource,
    /// The checkpoint's name of each text model tensor, by the text model's name.
    files: BTreeMap<String, String>,
}

impl<'a> TextOnly<'a> {
    /// The text model's view of `inner`, a checkpoint of `wrapper`. Two tensors that are
    /// the same text model tensor (`model.language_model.norm.weight` beside
    /// `model.norm.weight`) are refused, naming both.
    pub fn new(inner: &'a dyn TensorSource, wrapper: &HfWrapper) -> Result<TextOnly<'a>> {
        let mut files = BTreeMap::new();
        for name in inner.names() {
            let Some(text) = wrapper.text_name(&name) else { continue };
            if let Some(other) = files.insert(text.clone(), name.clone()) {
                return Err(Error::Io(format!(
                    "{}: tensors '{other}' and '{name}' are both the text model's '{text}' (a '{}' checkpoint)",
                    inner.origin(),
                    wrapper.model_type
                )));
            }
        }
        Ok(TextOnly { inner, files })
    }

    fn file(&self, name: &str) -> Result<&str> {
        self.files
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.inner.origin())))
    }
}

impl TensorSource for TextOnly<'_> {
    fn origin(&self) -> String {
        self.inner.origin()
    }
    fn names(&self) -> Vec<String> {
        self.files.keys().cloned().collect()
    }
    fn has(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }
    fn dtype(&self, name: &str) -> Result<DType> {
        self.inner.dtype(self.file(name)?)
    }
    fn get(&self, name: &str) -> Result<Tensor> {
        self.inner.get(self.file(name)?)
    }
    fn get_mapped(&self, name: &str) -> Result<Tensor> {
        self.inner.get_mapped(self.file(name)?)
    }
    fn take(&self, name: &str) -> Result<Tensor> {
        self.inner.take(self.file(name)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::qwen3_5::WRAPPER;

    /// Tensors by name, each a one-element tensor holding its index.
    struct Named(Vec<&'static str>);

    impl TensorSource for Named {
        fn origin(&self) -> String {
            "test".into()
        }
        fn names(&self) -> Vec<String> {
            self.0.iter().map(|s| s.to_string()).collect()
        }
        fn has(&self, name: &str) -> bool {
            self.0.contains(&name)
        }
        fn dtype(&self, _: &str) -> Result<DType> {
            Ok(DType::F32)
        }
        fn get(&self, name: &str) -> Result<Tensor> {
            let i = self.0.iter().position(|n| *n == name).ok_or_else(|| Error::Io(format!("no '{name}'")))?;
            Tensor::from_vec(vec![i as f32], vec![1])
        }
    }

    #[test]
    fn the_text_model_is_read_under_its_own_names_and_the_vision_tower_hidden() {
        let src = Named(vec![
            "lm_head.weight",
            "model.language_model.embed_tokens.weight",
            "model.language_model.layers.0.mlp.down_proj.weight",
            "model.visual.blocks.0.attn.qkv.weight",
            "mtp.fc.weight",
        ]);
        let t = TextOnly::new(&src, &WRAPPER).unwrap();
        assert_eq!(
            t.names(),
            ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "mtp.fc.weight"]
        );
        assert_eq!(t.get("model.layers.0.mlp.down_proj.weight").unwrap().to_vec_f32().unwrap(), [2.0]);
        assert_eq!(t.take("lm_head.weight").unwrap().to_vec_f32().unwrap(), [0.0]);
        assert!(!t.has("model.visual.blocks.0.attn.qkv.weight"));
        let e = t.get("model.visual.blocks.0.attn.qkv.weight").unwrap_err().to_string();
        assert!(e.contains("missing tensor"), "{e}");
        assert_eq!(
            WRAPPER.skipped_notice(src.0.iter().copied()).unwrap(),
            "text only: the vision tower (model.visual.*, 1 tensors) not loaded"
        );
        assert_eq!(WRAPPER.skipped_notice(["lm_head.weight"].into_iter()), None);
    }

    #[test]
    fn a_tensor_stored_under_both_names_is_refused() {
        let src = Named(vec!["model.language_model.norm.weight", "model.norm.weight"]);
        let e = TextOnly::new(&src, &WRAPPER).err().unwrap().to_string();
        assert!(e.contains("model.language_model.norm.weight") && e.contains("'model.norm.weight'"), "{e}");
    }
}
