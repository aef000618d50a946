//! k3-tokenizer
