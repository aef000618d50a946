//! The Kimi K3 graph: KDA, gated MLA (latent KV cache), Stable LatentMoE, block attention
//! residuals. Weights arrive through [`weights::WeightProvider`] and
//! [`weights::ExpertProvider`]; the model never opens a file.

pub mod weights;
