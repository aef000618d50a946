//! k3-engine
