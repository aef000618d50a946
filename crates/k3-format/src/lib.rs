//! Bytes on disk: safetensors shards, `config.json`, tensor binding by released names, routed
//! expert byte ranges and the packed-trunk format. No math lives here.

pub mod config;

pub use config::{ConfigShape, K3Config};
