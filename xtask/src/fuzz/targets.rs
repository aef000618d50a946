//! Format-level fuzz targets: safetensors shard headers, `config.json`, and the tiktoken
//! loader (`tiktoken.model` + `tokenizer_config.json`).

use super::mutate::{self, Rng};
use super::{workspace_root, Target};
use k3_format::synth::{config_json, mid_config, real_dims_config};
use k3_format::writer::{encode_header, TensorSpec};
use k3_format::{Dtype, K3Config, ShardHeader};
use k3_tokenizer::Tokenizer;
use std::path::Path;

fn fixture(rel: &str) -> Result<Vec<u8>, String> {
    let p = workspace_root().join("fixtures").join(rel);
    std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// `ShardHeader::parse` on a whole shard held in memory (the same call `Checkpoint::open`
/// makes on the mapped file).
pub struct Safetensors;

const ST_DICT: &[&[u8]] = &[
    b"dtype",
    b"shape",
    b"data_offsets",
    b"__metadata__",
    b"BF16",
    b"F32",
    b"F16",
    b"U8",
    b"I32",
    b"F8_E4M3",
    b"BOOL",
    b"F64",
    b"I64",
    b"format",
    b"pt",
];

fn shard(tensors: &[TensorSpec], fill: u8) -> Vec<u8> {
    let (mut out, data_len) = match encode_header(tensors) {
        Ok(h) => h,
        Err(_) => return Vec::new(),
    };
    out.resize(out.len() + data_len as usize, fill);
    out
}

/// Splits a shard into (header text, data) when its length prefix is in range.
fn split_shard(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (prefix, rest) = b.split_first_chunk::<8>()?;
    let n = usize::try_from(u64::from_le_bytes(*prefix)).ok()?;
    (n <= rest.len()).then(|| rest.split_at(n))
}

impl Target for Safetensors {
    fn seeds(&self) -> Vec<Vec<u8>> {
        let t = TensorSpec::new;
        let mut seeds = vec![
            shard(&[t("a", Dtype::F32, &[2, 3])], 1),
            shard(
                &[
                    t("layers.0.w", Dtype::BF16, &[4, 4]),
                    t("layers.0.n", Dtype::F32, &[4]),
                    t("scalar", Dtype::F32, &[]),
                    t("empty", Dtype::BF16, &[0, 4]),
                    t("experts.0.w1.weight_packed", Dtype::U8, &[2, 8]),
                    t("experts.0.w1.weight_scale", Dtype::U8, &[2, 1]),
                ],
                0x3f,
            ),
            shard(&[t("esc\"aped\\name\u{e9}", Dtype::I32, &[3])], 0),
            shard(&[], 0),
        ];
        let mut meta = br#"{"__metadata__":{"format":"pt"},"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}"#.to_vec();
        let mut s = (meta.len() as u64).to_le_bytes().to_vec();
        s.append(&mut meta);
        s.extend_from_slice(&[0; 4]);
        seeds.push(s);
        if let Ok(real) = fixture("tiny-k3/model-00002-of-00002.safetensors") {
            seeds.push(real);
        }
        seeds
    }

    fn dict(&self) -> Vec<&'static [u8]> {
        ST_DICT.to_vec()
    }

    fn mutate(&self, input: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
        // Mutate the JSON header, then fix the length prefix so the parse gets past it.
        let (header, data) = split_shard(input)?;
        let mut h = mutate::mutate(header, &[], ST_DICT, rng);
        if rng.chance(2) {
            while !(8 + h.len()).is_multiple_of(8) {
                h.push(b' ');
            }
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        match rng.below(4) {
            0 => out.truncate(out.len().saturating_sub(rng.below(16))),
            1 => out.extend(std::iter::repeat_n(0u8, rng.below(16))),
            _ => {}
        }
        Some(out)
    }

    fn run(&self, input: &[u8]) -> Result<(), String> {
        let h =
            ShardHeader::parse(Path::new("fuzz.safetensors"), input).map_err(|e| e.to_string())?;
        // Invariants of an accepted header: every tensor lies in the file with the byte size
        // its dtype and shape give, no two overlap, and the data section ends at the file end.
        let mut spans = Vec::new();
        for t in h.iter() {
            let size = k3_format::safetensors::byte_size(t.dtype, t.shape);
            assert_eq!(
                size,
                Some(t.end - t.start),
                "{}: span matches dtype x shape",
                t.name
            );
            assert!(
                t.offset + (t.end - t.start) <= h.file_len(),
                "{} inside the file",
                t.name
            );
            assert_eq!(t.offset, h.data_start() + t.start);
            if t.end > t.start {
                spans.push((t.start, t.end));
            }
        }
        spans.sort_unstable();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "no overlap");
        let data_end = h.iter().map(|t| t.end).max().unwrap_or(0);
        assert_eq!(
            h.data_start() + data_end,
            h.file_len(),
            "no trailing bytes accepted"
        );
        Ok(())
    }
}

/// `K3Config::from_json_str` on config text (nested and flat shapes).
pub struct Config {
    seeds: Vec<Vec<u8>>,
}

impl Config {
    pub fn new() -> Result<Config, String> {
        let mut seeds = vec![
            config_json(&K3Config::released()).into_bytes(),
            config_json(&real_dims_config(5, 16, 4096)).into_bytes(),
            config_json(&mid_config(7, 8, 2048)).into_bytes(),
        ];
        for f in [
            "tiny-k3/config.json",
            "tiny-k3-wide/config.json",
            "config-shapes/tiny-k3.flat.json",
        ] {
            seeds.push(fixture(f)?);
        }
        Ok(Config { seeds })
    }
}

const CONFIG_DICT: &[&[u8]] = &[
    b"hidden_size",
    b"num_hidden_layers",
    b"vocab_size",
    b"full_attn_layers",
    b"text_config",
    b"num_experts",
    b"num_experts_per_token",
    b"first_k_dense_replace",
    b"attn_res_block_size",
    b"short_conv_kernel_size",
    b"rms_norm_eps",
    b"kda_num_heads",
    b"kv_lora_rank",
    b"situ_beta",
    b"moe_intermediate_size",
];

impl Target for Config {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }
    fn dict(&self) -> Vec<&'static [u8]> {
        CONFIG_DICT.to_vec()
    }
    fn run(&self, input: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(input).map_err(|e| format!("not UTF-8: {e}"))?;
        let c = K3Config::from_json_str(text, "fuzz/config.json").map_err(|e| e.to_string())?;
        // Invariants the model code relies on (the layer helpers index with them).
        let n = c.num_hidden_layers;
        assert!(n >= 1 && c.hidden_size >= 1 && c.vocab_size >= 1);
        assert!(c.full_attn_layers.iter().all(|&l| (1..=n).contains(&l)));
        assert!(c.num_experts_per_token <= c.num_experts);
        assert!(c.attn_res_block_size >= 1 && c.first_k_dense_replace <= n);
        assert!(c.rms_norm_eps > 0.0);
        for l in 0..n {
            let _ = (
                c.is_mla(l),
                c.is_kda(l),
                c.is_dense(l),
                c.is_block_boundary(l),
            );
        }
        let _ = (
            c.kda_proj(),
            c.mla_qk_head(),
            c.mla_kv_a_width(),
            c.shared_inter(),
        );
        let _ = (c.max_blocks(), c.summary("fuzz"));
        Ok(())
    }
}

/// `Tokenizer::from_tiktoken_data` on `[u32 LE model length][tiktoken.model][config json]`.
pub struct Tiktoken {
    seeds: Vec<Vec<u8>>,
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn pack_pair(model: &[u8], config: &[u8]) -> Vec<u8> {
    let mut out = (model.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(model);
    out.extend_from_slice(config);
    out
}

fn split_pair(b: &[u8]) -> (&[u8], &[u8]) {
    let Some((len, rest)) = b.split_first_chunk::<4>() else {
        return (b, &[]);
    };
    let n = (u32::from_le_bytes(*len) as usize).min(rest.len());
    rest.split_at(n)
}

impl Tiktoken {
    pub fn new() -> Result<Tiktoken, String> {
        // In-process: the 256 single bytes plus a few merges, and two added tokens.
        let mut model = String::new();
        let mut rank = 0;
        for b in 0..=255u8 {
            model.push_str(&format!("{} {rank}\n", b64(&[b])));
            rank += 1;
        }
        for m in [
            "th", "he", "the", " t", " the", "in", "ing", "  ", "\u{e9}t",
        ] {
            model.push_str(&format!("{} {rank}\n", b64(m.as_bytes())));
            rank += 1;
        }
        let config = format!(
            r#"{{"added_tokens_decoder":{{"{r}":{{"content":"[BOS]","special":true}},"{}":{{"content":"[EOS]","special":true}}}},"bos_token":"[BOS]","eos_token":{{"content":"[EOS]"}}}}"#,
            rank + 1,
            r = rank
        );
        let mut seeds = vec![
            pack_pair(model.as_bytes(), config.as_bytes()),
            pack_pair(model.as_bytes(), b"{}"),
        ];
        seeds.push(pack_pair(
            &fixture("tiny-k3/tiktoken.model")?,
            &fixture("tiny-k3/tokenizer_config.json")?,
        ));
        Ok(Tiktoken { seeds })
    }
}

impl Target for Tiktoken {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }
    fn dict(&self) -> Vec<&'static [u8]> {
        vec![
            b"added_tokens_decoder",
            b"content",
            b"special",
            b"bos_token",
            b"eos_token",
            b"==",
            b"AA==",
            b"/w==",
            b" 16777215",
            b"\r\n",
            b"[EOS]",
        ]
    }
    fn mutate(&self, input: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
        let (model, config) = split_pair(input);
        let dict = self.dict();
        Some(if rng.chance(2) {
            pack_pair(&mutate::mutate(model, &[], &dict, rng), config)
        } else {
            pack_pair(model, &mutate::mutate(config, &[], &dict, rng))
        })
    }
    fn run(&self, input: &[u8]) -> Result<(), String> {
        let (model, config) = split_pair(input);
        let config = std::str::from_utf8(config).map_err(|e| format!("config not UTF-8: {e}"))?;
        let tok = Tokenizer::from_tiktoken_data(
            model,
            "fuzz/tiktoken.model",
            config,
            "fuzz/tokenizer_config.json",
        )
        .map_err(|e| e.to_string())?;
        // An accepted tokenizer is byte-level: every text round-trips exactly.
        for text in [
            "the thing",
            "  héllo\n\twörld 123",
            "",
            "[BOS]x[EOS]",
            "\u{0}\u{10ffff}",
        ] {
            let ids = tok.encode(text, false);
            let back = tok
                .decode(&ids)
                .map_err(|e| format!("decode of encode failed: {e}"));
            assert_eq!(
                back.as_deref(),
                Ok(text.as_bytes()),
                "round trip of {text:?}"
            );
            let _ = tok.encode(text, true);
        }
        for id in 0..(tok.vocab_size() as u32 + 2) {
            let _ = tok.decode(&[id]);
            let _ = tok.token_bytes(id);
        }
        Ok(())
    }
}
