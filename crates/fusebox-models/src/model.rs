//! [`Model`]: a transformer trained from scratch — a [`ModelConfig`] (the sizes and
//! style a checkpoint records) and the [`Transformer`] it describes. Forward, backward and
//! cached inference are the transformer's; this type only ties them to the config.

use fusebox::{ComputeBackend, Result};

use crate::config::ModelConfig;
use crate::params::{ParamSet, ParamSpec};
use crate::transformer::{layout, Arch, ParamIndex, Stacking, Transformer};

/// The architecture a from-scratch config describes: its style's preset
/// ([`crate::arch::Preset::block`]) of the config's sizes.
pub fn arch_of(cfg: &ModelConfig) -> Arch {
    cfg.arch()
}

/// The parameter specs (names, shapes, init) of a config and their indices.
pub fn param_specs(cfg: &ModelConfig) -> (Vec<ParamSpec>, ParamIndex) {
    layout(&arch_of(cfg), |_| Stacking::default())
}

/// A transformer trained from scratch, with the config its checkpoints record.
#[derive(Debug)]
pub struct Model {
    /// Sizes and choices (written beside checkpoints).
    pub config: ModelConfig,
    /// The network and its parameters (one allocation).
    pub net: Transformer,
}

impl Model {
    /// A freshly initialised model.
    pub fn new(backend: &dyn ComputeBackend, config: ModelConfig, seed: u64) -> Result<Model> {
        config.validate()?;
        let net = Transformer::new(backend, arch_of(&config), seed)?;
        Ok(Model { config, net })
    }

    /// A model around existing parameters (checked against the config's specs).
    pub fn from_params(backend: &dyn ComputeBackend, config: ModelConfig, params: ParamSet) -> Result<Model> {
        config.validate()?;
        let net = Transformer::from_params(backend, arch_of(&config), params)?;
        Ok(Model { config, net })
    }
}
