//! k3-model
