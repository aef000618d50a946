//! Memory planner: presets, trunk-first split, refusals, pinning optimality.

use k3_plan::plan::{
    min_trunk_budget, plan, plan_trunk, plan_trunk_with, LayerCost, PinStrategy, GB,
};
use k3_plan::{Available, Budget, ModelSizes, PlanError, PlanRequest, Preset};
use proptest::prelude::*;

fn k3() -> ModelSizes {
    ModelSizes::k3_estimate()
}

fn preset(p: Preset) -> k3_plan::MemoryPlan {
    plan(&k3(), &PlanRequest::new(Budget::Preset(p), 4096)).unwrap()
}

#[test]
fn presets_plan() {
    let laptop = preset(Preset::Laptop);
    assert_eq!(laptop.trunk.ring_slots, 2);
    assert!(!laptop.trunk.single_slot_forced);
    assert!(laptop.trunk.pinned.is_empty());
    assert_eq!(laptop.expert_slots, 56);
    let desktop = preset(Preset::Desktop);
    assert_eq!((desktop.trunk.ring_slots, desktop.expert_slots), (2, 569));
    assert!(
        desktop.trunk.pinned.contains(&0),
        "the dense layer leaves the ring"
    );
    assert!(desktop.trunk.total_bytes() <= 16 * GB);
    let server = preset(Preset::Server);
    assert!(
        server.trunk.pinned.len() >= 88,
        "{}",
        server.trunk.pinned.len()
    );
    assert_eq!(server.expert_slots, 740);
    assert_eq!(preset(Preset::Max).expert_slots, 6208);
    assert_eq!(preset(Preset::Workstation).expert_slots, 1708);
    for p in Preset::ALL {
        assert_eq!(p.name().parse::<Preset>().unwrap(), p);
        println!("{}\n", preset(p));
    }
}

#[test]
fn table_has_every_line() {
    let t = preset(Preset::Desktop).table(Some(&Available {
        mem_available: Some(64 * GB),
        cgroup_headroom: None,
    }));
    for l in [
        "trunk pinned",
        "trunk ring",
        "head (lm_head, norms)",
        "expert cache",
        "KDA state",
        "latent KV for ctx 4096",
        "scratch",
        "TOTAL",
        "available",
    ] {
        assert!(t.contains(l), "{l} missing in\n{t}");
    }
}

#[test]
fn total_budget_goes_to_the_trunk_first() {
    let s = k3();
    // with no context to prefill, the draft journal (4 n-gram drafts) is a cost on top
    let journal = s.draft_journal_bytes(k3_plan::plan::DEFAULT_DRAFTS);
    assert_eq!(journal, 88_235_520, "one layer's state + 4 x 20.4 MB");
    let fixed = s.head_bytes + s.kda_state_bytes + s.scratch_bytes + journal;
    // Enough for the whole trunk: everything pinned, the rest to the cache.
    let p = plan(&s, &PlanRequest::new(Budget::Total(200 * GB), 0)).unwrap();
    assert_eq!(p.trunk.pinned.len(), 93);
    assert_eq!(p.trunk.ring_slots, 0);
    let rest = 200 * GB - fixed - p.trunk.total_bytes();
    assert_eq!(p.expert_slots, rest / s.expert_slot_bytes());
    // Tight: the cache keeps only its minimum plus the trunk's leftovers.
    let p = plan(&s, &PlanRequest::new(Budget::Total(40 * GB), 0)).unwrap();
    assert!(p.trunk.total_bytes() > 30 * GB);
    let slack = 40 * GB - fixed - p.trunk.total_bytes() - p.expert_cache_bytes();
    assert!(slack < s.expert_slot_bytes());
    assert!(
        p.expert_slots >= 17 && p.expert_slots < 17 + 1500 / 17,
        "{}",
        p.expert_slots
    );
}

#[test]
fn refusals_name_the_flag_and_amount() {
    let s = k3();
    let split = |t: f64, c: f64| Budget::Split {
        trunk: (t * 1e9) as u64,
        cache: (c * 1e9) as u64,
    };
    let e = plan(&s, &PlanRequest::new(split(1.0, 10.0), 0)).unwrap_err();
    assert!(matches!(e, PlanError::TrunkTooSmall { .. }));
    assert!(
        e.to_string()
            .contains("raise --trunk-gb by 1.37 GB (to at least 2.37 GB)"),
        "{e}"
    );
    let e = plan(&s, &PlanRequest::new(split(16.0, 0.2), 0)).unwrap_err();
    assert!(e.to_string().contains("11 slots, fewer than top-k + 1 = 17: raise --cache-gb by 0.099 GB (to at least 0.30 GB)"), "{e}");
    // Smallest total with the estimate: 2.35 GB lm_head, 0.46 GB KDA state (69 KDA layers),
    // 0.07 GB scratch, 2.37 GB trunk, 0.30 GB cache = 5.55 GB.
    let e = plan(&s, &PlanRequest::new(Budget::Total(5_500_000_000), 0)).unwrap_err();
    assert!(e.to_string().contains("raise --mem-gb by"), "{e}");
    // a total too small for 4 drafts' journal (88.2 MB) plans fewer, not a refusal
    let tight = plan(&s, &PlanRequest::new(Budget::Total(5_600_000_000), 0)).unwrap();
    assert_eq!(
        tight.request.drafts, 2,
        "51 MB of slack: 6.7 MB + 2 x 20.4 MB"
    );
    assert!(tight.total_bytes() <= 5_600_000_000);
    let roomy = plan(&s, &PlanRequest::new(Budget::Total(5_700_000_000), 0)).unwrap();
    assert_eq!(roomy.request.drafts, 4);
    assert!(matches!(
        "huge".parse::<Preset>(),
        Err(PlanError::UnknownPreset(_))
    ));
}

#[test]
fn refuses_when_it_does_not_fit() {
    let s = k3();
    let p = preset(Preset::Desktop);
    let avail = |gb: u64| Available {
        mem_available: Some(gb * GB),
        cgroup_headroom: None,
    };
    assert!(p.check(&s, &avail(64)).is_ok());
    let e = p.check(&s, &avail(25)).unwrap_err().to_string();
    assert!(e.contains("lower --cache-gb by"), "{e}");
    assert!(e.contains("lower --trunk-gb by"), "{e}");
    assert!(e.contains("TOTAL"), "the table is part of the refusal: {e}");
    let e = p.check(&s, &avail(5)).unwrap_err().to_string();
    assert!(e.contains("even the smallest plan"), "{e}");
    let cg = Available {
        mem_available: Some(64 * GB),
        cgroup_headroom: Some(20 * GB),
    };
    assert!(p
        .check(&s, &cg)
        .unwrap_err()
        .to_string()
        .contains("cgroup headroom"));
    let big_ctx = plan(
        &s,
        &PlanRequest::new(Budget::Preset(Preset::Desktop), 200_000),
    )
    .unwrap();
    let e = big_ctx.check(&s, &avail(40)).unwrap_err().to_string();
    assert!(e.contains("lower --ctx by"), "{e}");
}

/// The released model at the laptop preset (an 8 GB machine): the trunk streams through a
/// ring of two pieces (token mixer, channel mixer) in no more memory than one whole-layer
/// slot, read-ahead on, and the whole plan — embedding rows read per token, not held — fits
/// in 7 GB.
#[test]
fn laptop_reads_ahead_within_7_gb() {
    let laptop = preset(Preset::Laptop);
    let t = &laptop.trunk;
    assert!(t.reads_ahead(), "{laptop}");
    assert_eq!(t.piece_slot_bytes.len(), 2);
    // One whole-layer slot's bytes, plus one page of alignment margin per piece (a piece
    // keeps its file offset modulo 4096 in its slot).
    let whole_slot = k3().layer_costs().iter().map(|l| l.slot).max().unwrap();
    let margin = 2 * 4096;
    assert!(
        t.ring_bytes() <= whole_slot + margin,
        "{} > {whole_slot}",
        t.ring_bytes()
    );
    assert!(laptop.total_bytes() <= 7 * GB, "{laptop}");
    assert_eq!(
        laptop.head_bytes,
        163_840 * 7168 * 2 + 3 * 7168 * 4,
        "lm_head only"
    );
    let table = laptop.table(None);
    assert!(table.contains("2 pieces ("), "{table}");
    assert!(table.contains("read-ahead on"), "{table}");
    assert!(!table.contains("HELD AT 1 SLOT"), "{table}");
    // Without pieces the same budget can only hold one whole-layer slot: no read-ahead.
    let mut whole = k3();
    whole.layer_piece_bytes.clear();
    let p = plan(
        &whole,
        &PlanRequest::new(Budget::Preset(Preset::Laptop), 4096),
    )
    .unwrap();
    assert!(p.trunk.single_slot_forced && !p.trunk.reads_ahead());
}

#[test]
fn ring_of_one_only_when_forced() {
    let mut whole = k3();
    whole.layer_piece_bytes.clear();
    let l = whole.layer_costs();
    let min = min_trunk_budget(&l);
    let p = plan_trunk(&l, min, 2).unwrap();
    assert_eq!(p.ring_slots, 1);
    assert!(p.single_slot_forced);
    assert!(plan_trunk(&l, min - 1, 2).is_none());
    let p = plan_trunk(&l, 2 * l[0].slot, 2).unwrap();
    assert_eq!((p.ring_slots, p.single_slot_forced), (2, false));
}

/// Bytes streamed per token under each strategy on the released profile.
#[test]
fn real_profile_comparison() {
    let l = k3().layer_costs();
    for gb in [3, 5, 10, 16, 30, 60, 100, 110] {
        let row: Vec<_> = [
            PinStrategy::Prefix,
            PinStrategy::LargestFirst,
            PinStrategy::Optimal,
        ]
        .map(|s| plan_trunk_with(&l, gb * GB, 2, s).unwrap())
        .into_iter()
        .collect();
        println!(
            "| {gb} GB | {:.2} | {:.2} | {:.2} | ring {} x {:.2} GB, {} pinned |",
            row[0].streamed_per_token as f64 / 1e9,
            row[1].streamed_per_token as f64 / 1e9,
            row[2].streamed_per_token as f64 / 1e9,
            row[2].ring_slots,
            row[2].ring_slot_bytes as f64 / 1e9,
            row[2].pinned.len()
        );
        assert!(row[2].streamed_per_token <= row[1].streamed_per_token);
        assert!(row[2].streamed_per_token <= row[0].streamed_per_token);
    }
}

/// Exhaustive minimum of streamed bytes with exactly `ring` slots (or all pinned).
fn brute(l: &[LayerCost], budget: u64, ring: usize) -> Option<u64> {
    (0u32..1 << l.len())
        .filter_map(|m| {
            let pinned = |i: usize| m >> i & 1 == 1;
            let cost: u64 = (0..l.len())
                .filter(|&i| pinned(i))
                .map(|i| l[i].pinned)
                .sum();
            let slot = (0..l.len())
                .filter(|&i| !pinned(i))
                .map(|i| l[i].slot)
                .max();
            let ring_bytes = slot.map_or(0, |s| s * ring as u64);
            let streamed = (0..l.len())
                .filter(|&i| !pinned(i))
                .map(|i| l[i].streamed)
                .sum();
            (cost + ring_bytes <= budget).then_some(streamed)
        })
        .min()
}

fn arb_layers() -> impl Strategy<Value = Vec<LayerCost>> {
    // A few size classes (like the real model) or fully random sizes.
    let run = prop_oneof![prop::sample::select(vec![3u64, 5, 9]), 1u64..40,];
    prop::collection::vec((run, 0u64..3), 1..10).prop_map(|v| {
        v.into_iter()
            .map(|(r, w)| LayerCost::new(r * 100_000, w * 4096))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn pinning_is_optimal(l in arb_layers(), frac in 0.0f64..1.2) {
        let full: u64 = l.iter().map(|x| x.pinned).sum();
        let budget = (full as f64 * frac) as u64;
        let got = plan_trunk(&l, budget, 2);
        let best2 = brute(&l, budget, 2);
        match (got, best2) {
            (None, _) => {
                prop_assert!(best2.is_none());
                prop_assert!(brute(&l, budget, 1).is_none());
            }
            (Some(p), Some(b)) => {
                prop_assert!(p.ring_slots == 2 || p.ring_slots == 0);
                prop_assert!(!p.single_slot_forced);
                prop_assert_eq!(p.streamed_per_token, b);
                prop_assert!(p.total_bytes() <= budget);
            }
            (Some(p), None) => {
                prop_assert_eq!(p.ring_slots, 1);
                prop_assert!(p.single_slot_forced);
                prop_assert_eq!(Some(p.streamed_per_token), brute(&l, budget, 1));
                prop_assert!(p.total_bytes() <= budget);
            }
        }
        for s in [PinStrategy::Prefix, PinStrategy::LargestFirst] {
            if let (Some(o), Some(b)) = (plan_trunk(&l, budget, 2), plan_trunk_with(&l, budget, 2, s)) {
                prop_assert!(b.total_bytes() <= budget);
                if o.ring_slots == b.ring_slots {
                    prop_assert!(o.streamed_per_token <= b.streamed_per_token);
                }
            }
        }
    }
}

#[test]
fn expert_cache_is_capped_at_the_expert_pool() {
    let s = k3();
    let p = plan(
        &s,
        &PlanRequest::new(
            Budget::Split {
                trunk: 200 * GB,
                cache: 100_000 * GB,
            },
            0,
        ),
    )
    .unwrap();
    assert_eq!(
        p.expert_slots, s.n_routed_experts,
        "no slot beyond the pool"
    );
}

#[test]
fn prefill_chunk_takes_an_eighth_of_the_budget() {
    let laptop = preset(Preset::Laptop);
    // the eighth also holds the draft journal of a verifying pass (88.2 MB: 4 drafts)
    assert_eq!(
        laptop.prefill_chunk, 211,
        "1 + ((3 + 1) GB / 8 - 88.2 MB) / 1.96 MB"
    );
    assert_eq!(
        laptop.prefill_scratch_bytes,
        210 * k3().prefill_bytes_per_token
    );
    assert_eq!(laptop.draft_journal_bytes, 88_235_520);
    let without = plan(
        &k3(),
        &PlanRequest::new(Budget::Preset(Preset::Laptop), 4096).with_drafts(0),
    )
    .unwrap();
    assert_eq!(without.prefill_chunk, 256, "1 + (3 + 1) GB / 8 / 1.96 MB");
    assert_eq!(without.draft_journal_bytes, 0);
    let total = |gb: u64, ctx: u64| {
        plan(&k3(), &PlanRequest::new(Budget::Total(gb * GB), ctx))
            .unwrap()
            .prefill_chunk
    };
    assert_eq!(total(16, 4096), 978);
    assert_eq!(total(32, 4096), 2001);
    assert_eq!(total(32, 300), 300, "never past the context");
    assert_eq!(total(1000, 100_000), 4096, "never past MAX_PREFILL_CHUNK");
    // The chunk's scratch is a fixed cost of a total budget: the cache gets the rest.
    let p = plan(&k3(), &PlanRequest::new(Budget::Total(32 * GB), 4096)).unwrap();
    assert!(p.total_bytes() <= 32 * GB);
    assert!(p.table(None).contains("2001 tokens per trunk pass"));
    // A total just above the smallest plan prefills token by token rather than refusing.
    let need = match plan(&k3(), &PlanRequest::new(Budget::Total(GB), 4096)) {
        Err(PlanError::TotalTooSmall { need, .. }) => need,
        other => panic!("1 GB cannot hold the released model: {other:?}"),
    };
    let tight = plan(&k3(), &PlanRequest::new(Budget::Total(need + 1000), 4096)).unwrap();
    assert_eq!(tight.prefill_chunk, 1);
    assert!(tight.total_bytes() <= need + 1000);
}

#[test]
fn every_reserved_session_gets_its_state_inside_the_budget() {
    let s = k3();
    let one = plan(&s, &PlanRequest::new(Budget::Total(16 * GB), 4096)).unwrap();
    let four = PlanRequest::new(Budget::Total(16 * GB), 4096).with_sessions(4);
    let p = plan(&s, &four).unwrap();
    assert_eq!(p.kda_state_bytes, 4 * one.kda_state_bytes);
    assert_eq!(p.latent_kv_bytes, 4 * one.latent_kv_bytes);
    assert!(p.total_bytes() <= 16 * GB, "never over the total");
    let weights = |p: &k3_plan::MemoryPlan| p.trunk.total_bytes() + p.expert_cache_bytes();
    assert!(
        weights(&p) < weights(&one),
        "the extra sessions' state comes out of the trunk pins and the cache"
    );
    assert!(p.table(None).contains("4 sessions"));
    // A preset keeps its trunk and cache budgets; the sessions' state is reported beside them.
    let laptop = PlanRequest::new(Budget::Preset(Preset::Laptop), 4096).with_sessions(4);
    let l = plan(&s, &laptop).unwrap();
    assert_eq!(
        l.kda_state_bytes,
        4 * preset(Preset::Laptop).kda_state_bytes
    );
    // Too many sessions for the total: refused with the need, never over budget.
    let crowd = PlanRequest::new(Budget::Total(16 * GB), 4096).with_sessions(4000);
    assert!(matches!(
        plan(&s, &crowd),
        Err(PlanError::TotalTooSmall { .. })
    ));
}
