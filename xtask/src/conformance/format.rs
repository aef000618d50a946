//! Conformance of `k3-format` against upstream `mxfp4.json`, `st/` and `cfg/`.

use super::Check;
use std::path::Path;

pub fn checks(_upstream: &Path) -> Vec<Check> {
    Vec::new()
}
