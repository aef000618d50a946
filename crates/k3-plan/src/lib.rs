//! k3-plan
