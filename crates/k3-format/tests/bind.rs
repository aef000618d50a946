//! Binding by released names on small synthetic checkpoints written with `k3_format::writer`.

use k3_format::bind::{
    bind_model, locate_expert, model_tensors, AttnTensors, BindError, ExpertDims, FfnTensors,
    NotContiguous,
};
use k3_format::writer::{write_shard, TensorSpec};
use k3_format::{Checkpoint, ConfigShape, Dtype, K3Config};
use std::path::Path;

/// A small config whose expert widths are multiples of 32 (MXFP4-packable).
fn cfg() -> K3Config {
    K3Config {
        hidden_size: 64,
        num_hidden_layers: 5,
        vocab_size: 32,
        rms_norm_eps: 1e-5,
        kda_num_heads: 2,
        kda_head_dim: 8,
        short_conv_kernel_size: 4,
        gate_lower_bound: -5.0,
        num_attention_heads: 2,
        q_lora_rank: 16,
        kv_lora_rank: 8,
        qk_nope_head_dim: 8,
        qk_rope_head_dim: 4,
        v_head_dim: 8,
        mla_use_output_gate: true,
        num_experts: 4,
        num_experts_per_token: 2,
        num_shared_experts: 1,
        routed_expert_hidden_size: 64,
        moe_intermediate_size: 32,
        routed_scaling_factor: 1.0,
        moe_renormalize: true,
        latent_moe_use_norm: true,
        first_k_dense_replace: 1,
        intermediate_size: 48,
        attn_res_block_size: 2,
        activation_situ_beta: 4.0,
        activation_situ_linear_beta: 25.0,
        full_attn_layers: vec![2, 5],
        shape: ConfigShape::Flat,
    }
}

/// Byte `j` of tensor `name`: derived from the name so aliasing shows.
fn byte(name: &str, j: usize) -> u8 {
    (seed(name) + j * 13) as u8
}

fn seed(name: &str) -> usize {
    name.bytes()
        .fold(7u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b))) as usize
}

fn write(path: &Path, tensors: &[TensorSpec]) {
    write_shard(path, tensors, |_, t, buf| {
        let s = seed(&t.name);
        for (j, b) in buf.iter_mut().enumerate() {
            *b = (s + j * 13) as u8;
        }
    })
    .unwrap();
}

/// One shard per group (globals, then one per layer), optionally edited first.
fn checkpoint(dir: &Path, edit: impl Fn(&mut Vec<Vec<TensorSpec>>)) -> Checkpoint {
    let mut groups = model_tensors(&cfg());
    edit(&mut groups);
    for (i, g) in groups.iter().enumerate() {
        write(&dir.join(format!("model-{i:05}.safetensors")), g);
    }
    Checkpoint::open(dir).unwrap()
}

fn edit_tensor(groups: &mut [Vec<TensorSpec>], suffix: &str, f: impl Fn(&mut TensorSpec)) {
    let t = groups
        .iter_mut()
        .flatten()
        .find(|t| t.name.ends_with(suffix))
        .unwrap();
    f(t);
}

fn remove_tensor(groups: &mut [Vec<TensorSpec>], name: &str) {
    for g in groups {
        g.retain(|t| t.name != name);
    }
}

#[test]
fn binds_every_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path(), |_| {});
    let m = bind_model(&ck, &cfg()).unwrap();
    assert_eq!(m.globals.embed_tokens.shape, vec![32, 64]);
    assert_eq!(m.globals.lm_head.name, "language_model.lm_head.weight");
    assert_eq!(m.layers.len(), 5);
    let kinds: String = m
        .layers
        .iter()
        .map(|l| match (&l.attn, &l.ffn) {
            (AttnTensors::Kda(_), FfnTensors::Dense(_)) => 'd',
            (AttnTensors::Kda(_), FfnTensors::Moe(_)) => 'k',
            (AttnTensors::Mla(_), FfnTensors::Moe(_)) => 'm',
            (AttnTensors::Mla(_), FfnTensors::Dense(_)) => 'D',
        })
        .collect();
    assert_eq!(kinds, "dmkkm");
    let AttnTensors::Kda(k) = &m.layers[0].attn else {
        unreachable!()
    };
    assert_eq!(k.q_conv1d.shape, vec![16, 1, 4]);
    assert_eq!(k.a_log.shape, vec![8]);
    let AttnTensors::Mla(a) = &m.layers[1].attn else {
        unreachable!()
    };
    assert_eq!(a.g_proj.as_ref().unwrap().shape, vec![16, 64]);
    // TensorRef points at the right bytes.
    let r = &m.layers[3].post_attention_layernorm;
    let shard = &ck.shards()[r.shard];
    let bytes = &shard.bytes()[r.offset as usize..r.end() as usize];
    assert!(bytes
        .iter()
        .enumerate()
        .all(|(j, &b)| b == byte(&r.name, j)));
    assert_eq!(m.experts.len(), 4 * 4);
}

#[test]
fn trunk_runs_are_contiguous_in_sorted_layout() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path(), |_| {});
    let m = bind_model(&ck, &cfg()).unwrap();
    for l in &m.layers {
        let run = l.trunk_run().unwrap();
        assert_eq!(run.shard, l.layer + 1);
        assert_eq!(run.len(), l.trunk_bytes());
        assert!(l
            .tensors()
            .iter()
            .all(|t| t.offset >= run.start && t.end() <= run.end));
    }
    // Layer 0 (dense) has no experts: its run starts at the data section.
    assert_eq!(
        m.layers[0].trunk_run().unwrap().start,
        ck.shards()[1].data_start()
    );
}

#[test]
fn trunk_run_reports_gaps_and_split_shards() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path(), |g| {
        g[1].push(TensorSpec::new(
            "language_model.model.layers.0.input_layernorm.zz",
            Dtype::U8,
            &[5],
        ));
        g[1].sort_by(|a, b| a.name.cmp(&b.name));
        let moved = g[3]
            .iter()
            .position(|t| t.name.ends_with("layers.2.mlp_res_norm.weight"))
            .unwrap();
        let t = g[3].remove(moved);
        g[0].push(t);
    });
    let m = bind_model(&ck, &cfg()).unwrap();
    let e = m.layers[0].trunk_run().unwrap_err();
    assert!(matches!(e, NotContiguous::Gaps { layer: 0, .. }), "{e:?}");
    assert!(e.to_string().contains("5 bytes in between"), "{e}");
    let e = m.layers[2].trunk_run().unwrap_err();
    assert!(matches!(e, NotContiguous::Shards { layer: 2, .. }), "{e:?}");
}

#[test]
fn experts_located_contiguously() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path(), |_| {});
    let m = bind_model(&ck, &cfg()).unwrap();
    let loc = m.expert(3, 2).unwrap();
    assert!(loc.is_contiguous());
    // w1 [32, 32] + [32, 2], w2 [64, 16] + [64, 1], w3 like w1.
    assert_eq!(loc.total_bytes, 1024 + 64 + 1024 + 64 + 1024 + 64);
    assert_eq!(loc.parts[0], (0, 1024));
    assert_eq!(loc.parts[5], (1024 + 64 + 1024 + 64 + 1024, 64));
    assert_eq!(loc.shapes[2], [64, 16]);
    let (off, len) = loc.reads[0];
    let buf = &ck.shards()[loc.shard].bytes()[off as usize..(off + len) as usize];
    for (i, part) in k3_format::bind::EXPERT_PARTS.iter().enumerate() {
        let name = format!("language_model.model.layers.3.block_sparse_moe.experts.2.{part}");
        let (at, n) = loc.parts[i];
        let slice = &buf[at as usize..(at + n) as usize];
        assert!(
            slice.iter().enumerate().all(|(j, &b)| b == byte(&name, j)),
            "{name}"
        );
    }
    assert_eq!(m.experts.scattered_count(), 0);
    assert_eq!(
        locate_expert(&ck, 3, 2, Some(ExpertDims::from_config(&cfg()))).unwrap(),
        loc
    );
}

#[test]
fn scattered_experts_use_canonical_layout() {
    let dir = tempfile::tempdir().unwrap();
    // Group the layer's tensors by part across experts (all w1p, then all w1s, ...).
    let ck = checkpoint(dir.path(), |g| {
        g[2].sort_by_key(|t| {
            let part = t.name.rsplit('.').take(2).collect::<Vec<_>>().join(".");
            (part, t.name.clone())
        })
    });
    let m = bind_model(&ck, &cfg()).unwrap();
    let loc = m.expert(1, 3).unwrap();
    assert_eq!(loc.reads.len(), 6);
    let sizes = [1024u64, 64, 1024, 64, 1024, 64];
    let mut at = 0;
    for (i, &size) in sizes.iter().enumerate() {
        assert_eq!(loc.parts[i], (at, size));
        assert_eq!(loc.reads[i].1, size);
        at += size;
    }
    assert_eq!(m.experts.scattered_count(), 4);
}

fn bind_err(edit: impl Fn(&mut Vec<Vec<TensorSpec>>)) -> BindError {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path(), edit);
    bind_model(&ck, &cfg()).unwrap_err()
}

#[test]
fn missing_wrong_shape_and_dtype_are_named() {
    let name = "language_model.model.layers.2.self_attn.k_proj.weight";
    let e = bind_err(|g| remove_tensor(g, name));
    assert!(
        e.to_string().contains(&format!("{name:?} is missing")),
        "{e}"
    );

    let e = bind_err(|g| {
        edit_tensor(g, "layers.2.self_attn.k_proj.weight", |t| {
            t.shape = vec![16, 63]
        })
    });
    assert_eq!(
        e.to_string(),
        format!("tensor {name:?} has shape [16, 63], expected [16, 64] from the config: checkpoint and config.json disagree")
    );
    let e = bind_err(|g| {
        edit_tensor(g, "layers.2.self_attn.k_proj.weight", |t| {
            t.dtype = Dtype::F16
        })
    });
    assert_eq!(
        e.to_string(),
        format!("tensor {name:?} is F16, expected BF16 or F32 (matrix)")
    );
    let e = bind_err(|g| edit_tensor(g, "layers.0.mlp_res_norm.weight", |t| t.dtype = Dtype::I32));
    assert!(
        e.to_string()
            .contains("is I32, expected BF16, F16 or F32 (vector)"),
        "{e}"
    );
    let e = bind_err(|g| edit_tensor(g, "layers.0.self_attn.A_log", |t| t.shape = vec![1]));
    assert!(e.to_string().contains("expected [D] with D >= 2"), "{e}");
    let e = bind_err(|g| remove_tensor(g, "language_model.lm_head.weight"));
    assert!(matches!(e, BindError::Missing { .. }));
}

#[test]
fn alternative_vector_shapes_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path(), |g| {
        edit_tensor(g, "layers.0.mlp_res_proj.weight", |t| t.shape = vec![64]);
        edit_tensor(g, "layers.0.self_attn.q_conv1d.weight", |t| {
            t.shape = vec![16, 4]
        });
        edit_tensor(g, "layers.0.input_layernorm.weight", |t| {
            t.dtype = Dtype::F32
        });
        edit_tensor(g, "layers.0.post_attention_layernorm.weight", |t| {
            t.dtype = Dtype::F16
        });
        edit_tensor(g, "layers.0.mlp.up_proj.weight", |t| t.dtype = Dtype::F32);
    });
    assert!(bind_model(&ck, &cfg()).is_ok());
}

#[test]
fn mla_without_output_gate() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg();
    c.mla_use_output_gate = false;
    let ck = checkpoint(dir.path(), |g| {
        remove_tensor(g, "language_model.model.layers.1.self_attn.g_proj.weight")
    });
    let m = bind_model(&ck, &c).unwrap();
    let AttnTensors::Mla(a) = &m.layers[1].attn else {
        unreachable!()
    };
    assert!(a.g_proj.is_none());
}

#[test]
fn expert_rules() {
    let pre = "language_model.model.layers.2.block_sparse_moe.experts.1";
    let e = bind_err(|g| {
        edit_tensor(
            g,
            "layers.2.block_sparse_moe.experts.1.w2.weight_scale",
            |t| t.shape = vec![64, 2],
        )
    });
    let msg = e.to_string();
    assert!(matches!(e, BindError::ExpertGroup { .. }), "{e:?}");
    assert!(
        msg.contains(&format!("{pre}.w2.weight_packed"))
            && msg.contains("imply group size 16, not 32"),
        "{msg}"
    );

    let e = bind_err(|g| {
        edit_tensor(
            g,
            "layers.2.block_sparse_moe.experts.1.w1.weight_scale",
            |t| t.shape = vec![31, 2],
        )
    });
    assert!(
        e.to_string().contains("(32 rows)") && e.to_string().contains("(31 rows)"),
        "{e}"
    );

    let e = bind_err(|g| {
        edit_tensor(
            g,
            "layers.2.block_sparse_moe.experts.1.w3.weight_packed",
            |t| t.dtype = Dtype::I8,
        )
    });
    assert!(e.to_string().contains("is I8, expected U8 (MXFP4)"), "{e}");

    let e = bind_err(|g| {
        edit_tensor(
            g,
            "layers.2.block_sparse_moe.experts.1.w1.weight_packed",
            |t| t.shape = vec![16, 32],
        );
        edit_tensor(
            g,
            "layers.2.block_sparse_moe.experts.1.w1.weight_scale",
            |t| t.shape = vec![16, 2],
        );
    });
    assert!(
        e.to_string().contains("shape [16, 32], expected [32, 32]"),
        "{e}"
    );

    let e = bind_err(|g| {
        let i = g[3]
            .iter()
            .position(|t| t.name == format!("{pre}.w3.weight_scale"))
            .unwrap();
        let t = g[3].remove(i);
        g[0].push(t);
    });
    assert!(
        matches!(
            e,
            BindError::ExpertShards {
                layer: 2,
                expert: 1,
                ..
            }
        ),
        "{e:?}"
    );

    let e = bind_err(|g| remove_tensor(g, &format!("{pre}.w2.weight_packed")));
    assert!(
        e.to_string().contains("w2.weight_packed\" is missing"),
        "{e}"
    );
}

#[test]
fn no_such_expert() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path(), |_| {});
    let m = bind_model(&ck, &cfg()).unwrap();
    let msg = m.expert(0, 0).unwrap_err().to_string();
    assert!(
        msg.contains("layer 0 is dense (first_k_dense_replace = 1)"),
        "{msg}"
    );
    assert!(m
        .expert(5, 0)
        .unwrap_err()
        .to_string()
        .contains("the model has 5 layers"));
    assert!(m
        .expert(1, 4)
        .unwrap_err()
        .to_string()
        .contains("4 experts per layer"));
}
