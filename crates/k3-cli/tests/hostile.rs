//! The hostile-input suite: damaged copies of the tiny checkpoint, generated at test time, are
//! refused with the documented exit code and a message naming the culprit, and never panic;
//! valid oddities still run. Catalogue: docs/RELIABILITY.md
//! (`K3_HOSTILE_CATALOGUE=DIR cargo test -p k3-cli --test hostile` writes its rows).

#[path = "hostile/binding.rs"]
mod binding;
#[path = "hostile/cli.rs"]
mod cli;
#[path = "hostile/common.rs"]
mod common;
#[path = "hostile/config.rs"]
mod config;
#[path = "hostile/drafts.rs"]
mod drafts;
#[path = "hostile/index.rs"]
mod index;
#[path = "hostile/packs.rs"]
mod packs;
#[path = "hostile/safetensors.rs"]
mod safetensors;
#[path = "hostile/session.rs"]
mod session;
#[path = "hostile/tokenizer.rs"]
mod tokenizer;
