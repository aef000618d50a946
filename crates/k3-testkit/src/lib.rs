//! Test and benchmark support shared across k3's crates (a dev-dependency, never shipped):
//! synthetic kernel inputs for the benches, and an independent writer of upstream-format trunk
//! packs for the adopt tests. Shared through a crate so that no crate compiles another's
//! files by path.

pub mod bench_data;
pub mod upstream_pack;
