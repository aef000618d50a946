//! Bytes on disk: safetensors shards, `config.json`, tensor binding by released names, routed
//! expert byte ranges and the packed-trunk format. No math lives here.
//!
//! - [`Checkpoint::open`] indexes a directory of safetensors shards (integrity-checked, with
//!   zero-copy [`TensorView`]s).
//! - [`K3Config::load`] reads `config.json` in either accepted shape (docs/MODEL.md#configuration).
//! - [`bind_model`] binds every tensor by its released name and locates the routed experts.
//! - [`write_trunk_pack`] and [`TrunkPack`] write, open and check the packed trunk (docs/FORMATS.md#packed-trunk).

#![warn(missing_docs)]
// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

#[cfg(not(target_endian = "little"))]
compile_error!(
    "k3-format reads little-endian tensor data in place; big-endian hosts are not supported"
);

pub mod bind;
pub mod config;
pub mod dspark;
pub mod dtype;
pub mod error;
mod header;
pub mod index;
pub mod pack;
pub mod par;
pub mod released;
pub mod safetensors;
mod shard_list;
pub mod synth;
pub mod verify;
pub mod verify_deep;
pub mod view;
pub mod writer;

pub use bind::{bind_model, BindError, ExpertLocation, ModelBinding, TensorRef};
pub use config::{ConfigError, ConfigShape, K3Config};
pub use dspark::{DsparkCheckpoint, DsparkConfig, DsparkError};
pub use dtype::Dtype;
pub use error::FormatError;
pub use index::{Checkpoint, Shard, INDEX_FILE};
pub use pack::{write_trunk_pack, PackError, TrunkPack};
pub use safetensors::{HeaderTensor, ShardHeader};
pub use view::TensorView;
pub use writer::TensorSpec;
