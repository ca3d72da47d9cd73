//! The seeded generator of the data sampler and initialisation: the workspace's one
//! SplitMix64 ([`fusebox::rng::Rng`]), whose whole state is one `u64`, so the data
//! sampler's position can be saved in a checkpoint and resumed exactly.

pub use fusebox::rng::Rng;
