//! [`ParamSource`]: what a run trains — a network, the tensors of it the optimizer
//! updates, and what its checkpoints record besides them. [`Model`] (from scratch) is one;
//! a pretrained model ([`crate::finetune::Loaded`], full or LoRA) is the other.

use fusebox::{ComputeBackend, Result};
use serde_json::Value;

use super::Batch;
use crate::model::Model;
use crate::params::{ParamSet, ParamSpec};
use crate::transformer::{GradsReady, LossOptions, Transformer};

/// A network to train and how its checkpoints describe it.
///
/// The trained tensors are the LoRA adapters when the network has them attached (the base
/// stays frozen, block formats included), else every parameter.
pub trait ParamSource {
    /// The network.
    fn net(&self) -> &Transformer;

    /// The network, writable (the optimizer updates it).
    fn net_mut(&mut self) -> &mut Transformer;

    /// A checkpoint's `config.json`.
    fn checkpoint_config(&self) -> Value;

    /// Further files of a checkpoint, `(file name, bytes)`: none by default.
    fn checkpoint_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(Vec::new())
    }

    /// Sections `(key, value)` added to a checkpoint's `trainer.json`: none by default.
    fn checkpoint_state(&self) -> Vec<(String, Value)> {
        Vec::new()
    }

    /// Specs and tensors of what is trained: the adapters, else every parameter.
    fn trained(&self) -> (&[ParamSpec], &ParamSet) {
        let net = self.net();
        match &net.lora {
            Some(ad) => (&ad.specs, &ad.params),
            None => (&net.specs, &net.params),
        }
    }

    /// [`trained`](Self::trained), writable.
    fn trained_mut(&mut self) -> (&[ParamSpec], &mut ParamSet) {
        let net = self.net_mut();
        match &mut net.lora {
            Some(ad) => (&ad.specs, &mut ad.params),
            None => (&net.specs, &mut net.params),
        }
    }

    /// Mean cross-entropy of one micro-batch (targets equal to `opts.ignore` do not count)
    /// and its gradient with respect to the trained tensors, times `opts.grad_scale`, added
    /// into `grads` (see [`Transformer::train_loss_and_grads`]). `ready(grads, indices)`
    /// hears of every gradient exactly once when it is final: block by block during the
    /// backward of every parameter, all at once after the backward of the adapters.
    fn loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        batch: Batch,
        opts: LossOptions,
        grads: &mut ParamSet,
        ready: &mut GradsReady<'_>,
    ) -> Result<f32> {
        let (ids, targets) = batch.upload(b)?;
        self.net().train_loss_and_grads(b, &ids, &targets, opts, grads, ready)
    }
}

/// A from-scratch model: its checkpoints record its [`crate::ModelConfig`].
impl ParamSource for Model {
    fn net(&self) -> &Transformer {
        &self.net
    }

    fn net_mut(&mut self) -> &mut Transformer {
        &mut self.net
    }

    fn checkpoint_config(&self) -> Value {
        self.config.to_json()
    }
}
