//! [`WgpuBackendBuilder`]: which adapter a [`WgpuBackend`] opens, and whether it traces
//! its CPU fallbacks. Nothing here reads the environment (the `fusebox` command line
//! maps its variables onto these settings).

use fusebox::{Error, Result};

use crate::backend::WgpuBackend;
use crate::context::Context;

/// Which GPU adapter to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterChoice {
    /// The adapter wgpu recommends for the power preference (the default).
    Preferred,
    /// The adapter at this index of [`WgpuBackend::adapters`].
    Index(usize),
    /// The first adapter of [`WgpuBackend::adapters`] whose name contains this text
    /// (ignoring case), e.g. `"llvmpipe"` or `"nvidia"`.
    Name(String),
}

impl std::str::FromStr for AdapterChoice {
    type Err = Error;

    /// A number is an index, any other non-empty text a name to search for.
    fn from_str(s: &str) -> Result<AdapterChoice> {
        let s = s.trim();
        if s.is_empty() {
            return Err(Error::value("AdapterChoice::from_str", "adapter", "an index or a name", "''"));
        }
        Ok(s.parse::<usize>().map_or_else(|_| AdapterChoice::Name(s.to_string()), AdapterChoice::Index))
    }
}

/// Which kind of adapter [`AdapterChoice::Preferred`] favours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerPreference {
    /// A discrete GPU when there is one (the default).
    HighPerformance,
    /// An integrated GPU when there is one.
    LowPower,
    /// No preference.
    None,
}

impl std::str::FromStr for PowerPreference {
    type Err = Error;

    /// `high`, `low` or `none`, ignoring case.
    fn from_str(s: &str) -> Result<PowerPreference> {
        match s.trim().to_ascii_lowercase().as_str() {
            "high" => Ok(PowerPreference::HighPerformance),
            "low" => Ok(PowerPreference::LowPower),
            "none" => Ok(PowerPreference::None),
            _ => Err(Error::value("PowerPreference::from_str", "power preference", "high, low or none", s)),
        }
    }
}

impl PowerPreference {
    pub(crate) fn to_wgpu(self) -> wgpu::PowerPreference {
        match self {
            PowerPreference::HighPerformance => wgpu::PowerPreference::HighPerformance,
            PowerPreference::LowPower => wgpu::PowerPreference::LowPower,
            PowerPreference::None => wgpu::PowerPreference::None,
        }
    }
}

/// Settings of a [`WgpuBackend`], from [`WgpuBackend::builder`].
#[derive(Debug, Clone)]
pub struct WgpuBackendBuilder {
    pub(crate) adapter: AdapterChoice,
    pub(crate) power: PowerPreference,
    pub(crate) trace: bool,
}

impl Default for WgpuBackendBuilder {
    fn default() -> Self {
        WgpuBackendBuilder { adapter: AdapterChoice::Preferred, power: PowerPreference::HighPerformance, trace: false }
    }
}

impl WgpuBackendBuilder {
    /// Which adapter to open (default: [`AdapterChoice::Preferred`]).
    pub fn adapter(mut self, choice: AdapterChoice) -> Self {
        self.adapter = choice;
        self
    }

    /// Which kind of adapter [`AdapterChoice::Preferred`] favours (default: high
    /// performance).
    pub fn power_preference(mut self, power: PowerPreference) -> Self {
        self.power = power;
        self
    }

    /// Whether each op that falls back to the CPU is named on stderr (default false).
    pub fn trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }

    /// Opens the adapter and its device: an error naming what was tried when there is
    /// none, or none that matches the choice (the error lists the adapters there are).
    pub fn build(self) -> Result<WgpuBackend> {
        Ok(WgpuBackend::from_context(Context::new(&self)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_refuse_bad_text() {
        assert_eq!("2".parse::<AdapterChoice>().unwrap(), AdapterChoice::Index(2));
        assert_eq!(" llvmpipe ".parse::<AdapterChoice>().unwrap(), AdapterChoice::Name("llvmpipe".into()));
        assert!("  ".parse::<AdapterChoice>().is_err());
        assert_eq!("LOW".parse::<PowerPreference>().unwrap(), PowerPreference::LowPower);
        assert_eq!("high".parse::<PowerPreference>().unwrap(), PowerPreference::HighPerformance);
        let err = "fast".parse::<PowerPreference>().unwrap_err().to_string();
        assert!(err.contains("fast") && err.contains("high, low or none"), "{err}");
    }

    /// An adapter is opened by index and by name; a name no adapter has is an error that
    /// lists the adapters there are, and tracing is the builder's setting.
    #[test]
    fn adapters_are_chosen_by_index_and_name() {
        let adapters = WgpuBackend::adapters();
        if adapters.is_empty() {
            assert!(
                !std::env::var("FUSEBOX_REQUIRE_GPU_ADAPTER").is_ok_and(|v| v == "1"),
                "no GPU adapter, and FUSEBOX_REQUIRE_GPU_ADAPTER=1"
            );
            println!("skipped: no GPU adapter");
            return;
        }
        let first = WgpuBackend::builder().adapter(AdapterChoice::Index(0)).trace(true).build().unwrap();
        assert!(first.ctx.trace);
        let name = first.ctx.info.name.clone();
        let by_name = WgpuBackend::builder().adapter(AdapterChoice::Name(name.to_uppercase())).build().unwrap();
        assert_eq!(by_name.ctx.info.name, name);
        assert!(!by_name.ctx.trace);
        let err = WgpuBackend::builder().adapter(AdapterChoice::Name("no such adapter".into())).build().unwrap_err();
        assert!(err.to_string().contains(&name), "{err}");
        let past = WgpuBackend::builder().adapter(AdapterChoice::Index(adapters.len())).build();
        assert!(past.is_err());
    }
}
