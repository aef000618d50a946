//! The released geometry at full size, without a forward pass (docs/PERFORMANCE.md#released-geometry):
//! the 96 shard headers (497,220 tensors, 1.56 TB apparent, every tensor a hole) are written
//! to a temp dir, opened, bound and planned at every preset. The engine's sizes must equal
//! the planner's built-in estimate of the release layer by layer, KDA state must count the
//! 69 KDA layers only, and the laptop preset must plan within 8 GiB.

use k3_engine::planning::model_sizes;
use k3_engine::{Budget, Preset};
use k3_format::{bind_model, Checkpoint, K3Config};
use k3_plan::{ModelSizes, PlanRequest};

#[test]
fn released_geometry_plans_every_preset() {
    let dir = std::env::temp_dir().join(format!("k3-released-plan-{}", std::process::id()));
    let sum = k3_format::released::write_sparse(&dir, 0, false).unwrap();
    let result = std::panic::catch_unwind(|| check(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(sum.n_tensors, k3_format::released::TENSORS);
    assert!(
        sum.apparent_bytes > 1_550_000_000_000,
        "{}",
        sum.apparent_bytes
    );
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn check(dir: &std::path::Path) {
    let cfg = K3Config::load(dir.join("config.json")).unwrap();
    assert_eq!((cfg.num_hidden_layers, cfg.num_mla_layers()), (93, 24));
    let ck = Checkpoint::open(dir).unwrap();
    assert_eq!(ck.shards().len(), 96);
    let b = bind_model(&ck, &cfg).unwrap();
    let s = model_sizes(&cfg, &b).unwrap();
    let est = ModelSizes::k3_estimate();
    assert_eq!(s.layer_run_bytes, est.layer_run_bytes);
    assert_eq!(s.kda_state_bytes, est.kda_state_bytes);
    assert_eq!(s.kda_state_bytes, 69 * 1_683_456 * 4);
    assert_eq!(s.latent_kv_bytes_per_pos, est.latent_kv_bytes_per_pos);
    assert_eq!(
        (s.expert_bytes, s.n_routed_experts, s.top_k),
        (17_547_264, 82_432, 16)
    );
    assert_eq!(s.prefill_bytes_per_token, est.prefill_bytes_per_token);
    // a draft's KDA journal over 69 layers, and one layer's state copy
    assert_eq!(s.journal_bytes_per_draft, est.journal_bytes_per_draft);
    assert_eq!(s.journal_bytes_per_draft, 69 * (6 * 12_288 + 96) * 4);
    assert_eq!(s.tentative_state_bytes, est.tentative_state_bytes);
    for p in Preset::ALL {
        let plan = k3_plan::plan::plan(&s, &PlanRequest::new(Budget::Preset(p), 4096)).unwrap();
        let (trunk, cache) = p.gb();
        assert!(plan.trunk.total_bytes() <= trunk * 1_000_000_000, "{p}");
        assert!(plan.expert_cache_bytes() <= cache * 1_000_000_000, "{p}");
        if p == Preset::Laptop {
            assert!(plan.total_bytes() <= 8 << 30, "{p}: {}", plan.total_bytes());
        }
    }
    for gb in [8u64, 16, 32] {
        let plan = k3_plan::plan::plan(
            &s,
            &PlanRequest::new(Budget::Total(gb * 1_000_000_000), 4096),
        )
        .unwrap();
        assert!(plan.total_bytes() <= gb * 1_000_000_000, "--mem-gb {gb}");
    }
}
