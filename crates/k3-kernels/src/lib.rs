//! k3-kernels
