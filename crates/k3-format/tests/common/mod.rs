//! Helpers that write small safetensors shards for the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// One tensor to write: name, dtype spelling, shape, raw little-endian bytes.
pub struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// A tensor whose bytes are `f(i)` for byte i.
pub fn t(name: &str, dtype: &'static str, shape: &[u64], elem: usize) -> T {
    let n: u64 = shape.iter().product();
    let data = (0..n as usize * elem)
        .map(|i| (i * 7 + name.len()) as u8)
        .collect();
    T {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// An F32 tensor holding `values`.
pub fn f32s(name: &str, shape: &[u64], values: &[f32]) -> T {
    T {
        name: name.into(),
        dtype: "F32",
        shape: shape.to_vec(),
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// JSON string literal.
pub fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Serialises tensors back to back, with `pad` spaces appended to the header.
pub fn shard_bytes_padded(tensors: &[T], pad: usize) -> Vec<u8> {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut off = 0usize;
    for t in tensors {
        let end = off + t.data.len();
        header.push_str(&format!(
            ",{}:{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{off},{end}]}}",
            js(&t.name),
            t.dtype,
            t.shape
        ));
        off = end;
    }
    header.push('}');
    header.push_str(&" ".repeat(pad));
    raw_shard(
        &header,
        &tensors
            .iter()
            .flat_map(|t| t.data.clone())
            .collect::<Vec<_>>(),
    )
}

/// Serialises tensors back to back.
pub fn shard_bytes(tensors: &[T]) -> Vec<u8> {
    shard_bytes_padded(tensors, 0)
}

/// A shard from a literal header and data.
pub fn raw_shard(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Writes a `model.safetensors.index.json` with the given (tensor, shard) pairs.
pub fn write_index(dir: &Path, pairs: &[(&str, &str)]) -> PathBuf {
    let body: Vec<String> = pairs
        .iter()
        .map(|(t, s)| format!("{}:{}", js(t), js(s)))
        .collect();
    let text = format!(
        "{{\"metadata\":{{\"total_size\":1}},\"weight_map\":{{{}}}}}",
        body.join(",")
    );
    write(dir, "model.safetensors.index.json", text.as_bytes())
}
