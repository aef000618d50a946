//! Per-rank plans and stores (docs/DISTRIBUTED.md#memory-per-rank), in-process: with a
//! group, each rank plans from its share (trunk rows, `lm_head` rows, owned experts), its
//! streaming stores read and hold only those bytes, and ids and logits stay bit-identical to
//! one process at every per-rank budget (the smallest, everything pinned, anything between)
//! and thread count. The counting `Comm` decorator's figures reach `Engine::rank_figures`.

use k3_engine::planning::{budget_extremes, budget_extremes_rank, rank_sizes};
use k3_engine::{Budget, Engine};
use k3_format::{bind_model, Checkpoint, K3Config};
use k3_model::{Comm, LocalComm};
use proptest::prelude::*;
use std::sync::Arc;

#[path = "support/ranks.rs"]
mod ranks;
use ranks::{dir, options, reference, trace, Trace, PROMPT};

/// What one rank saw and did.
struct RankRun {
    trace: Trace,
    trunk_bytes_at_open: u64,
    pinned_layers: usize,
}

/// `ranks` ranks as threads; rank `r` gets `budget(r)`.
fn group(
    name: &str,
    ranks: usize,
    threads: usize,
    budget: &(dyn Fn(usize) -> Option<Budget> + Sync),
) -> Vec<RankRun> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = LocalComm::group(ranks)
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                scope.spawn(move || {
                    let comm: Arc<dyn Comm> = Arc::new(c);
                    let o = options(threads, budget(r), Some(Arc::clone(&comm)));
                    let engine = Engine::open(&dir(name), o).unwrap();
                    let trunk_bytes_at_open = engine.stats().trunk_bytes_read;
                    let pinned_layers = engine.plan().map_or(0, |p| p.trunk.pinned.len());
                    RankRun {
                        trace: trace(&engine, comm.as_ref()),
                        trunk_bytes_at_open,
                        pinned_layers,
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn assert_bit_identical(name: &str, runs: &[RankRun], what: &str) {
    let want = reference(name);
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.trace.ids, want.ids, "{name} {what} rank {r}: ids");
        assert!(
            run.trace.logit_bits == want.logit_bits,
            "{name} {what} rank {r}: logits differ from one process"
        );
    }
}

#[test]
fn the_smallest_per_rank_budget_streams_shares_bit_identically() {
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let whole_min = budget_extremes(&dir(name)).unwrap().0;
        for ranks in [2, 3] {
            let mins: Vec<Budget> = (0..ranks)
                .map(|r| budget_extremes_rank(&dir(name), r, ranks).unwrap().0)
                .collect();
            // a share's ring slot is smaller than a whole layer's: the rank's smallest
            // budget is below one process's, which proves the ring holds shares only
            let (Budget::Split { trunk: w, .. }, Budget::Split { trunk: m, .. }) =
                (whole_min, mins[0])
            else {
                panic!("splits expected")
            };
            assert!(
                m < w,
                "{name} N={ranks}: rank trunk minimum {m} vs whole {w}"
            );
            let runs = group(name, ranks, 1, &|r| Some(mins[r]));
            assert_bit_identical(name, &runs, &format!("N={ranks} smallest"));
        }
    }
}

/// Ranks with different budgets plan different prefill chunks; they agree on the smallest
/// at open, so their passes (and collectives) line up.
#[test]
fn ranks_with_different_budgets_feed_the_same_chunks() {
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let runs = group(name, 2, 1, &|r| {
            let (lo, hi) = budget_extremes_rank(&dir(name), r, 2).unwrap();
            Some(if r == 0 { hi } else { lo })
        });
        assert_bit_identical(name, &runs, "N=2 one pinned, one smallest");
        let runs = group(name, 3, 1, &|r| {
            (r != 1).then(|| budget_extremes(&dir(name)).unwrap().0)
        });
        assert_bit_identical(name, &runs, "N=3 one resident, two streaming");
    }
}

#[test]
fn everything_pinned_reads_each_rank_its_share_once() {
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let all = budget_extremes(&dir(name)).unwrap().1;
        let one = group(name, 1, 2, &|_| Some(all));
        let whole = one[0].trunk_bytes_at_open;
        for ranks in [2, 3] {
            let runs = group(name, ranks, 2, &|r| {
                Some(budget_extremes_rank(&dir(name), r, ranks).unwrap().1)
            });
            assert_bit_identical(name, &runs, &format!("N={ranks} pinned"));
            let layers = K3Config::load(dir(name).join("config.json"))
                .unwrap()
                .num_hidden_layers;
            let sum: u64 = runs.iter().map(|r| r.trunk_bytes_at_open).sum();
            for (r, run) in runs.iter().enumerate() {
                assert_eq!(run.pinned_layers, layers, "{name} N={ranks} rank {r}");
                let share = run.trunk_bytes_at_open as f64 / whole as f64;
                // replicated tensors (norms, router, kv_b, conv taps) keep it above 1/N
                assert!(
                    share < 1.0 / ranks as f64 + 0.2,
                    "{name} N={ranks} rank {r}: read {share:.3} of the trunk"
                );
            }
            assert!(sum >= whole, "{name} N={ranks}: ranks read {sum} < {whole}");
        }
    }
}

#[test]
fn rank_sizes_shrink_the_trunk_and_the_expert_pool() {
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let d = dir(name);
        let cfg = K3Config::load(d.join("config.json")).unwrap();
        let b = bind_model(&Checkpoint::open(&d).unwrap(), &cfg).unwrap();
        let whole = rank_sizes(&cfg, &b, 0, 1).unwrap();
        for ranks in [2usize, 3] {
            let per: Vec<_> = (0..ranks)
                .map(|r| rank_sizes(&cfg, &b, r, ranks).unwrap())
                .collect();
            let experts: u64 = per.iter().map(|s| s.n_routed_experts).sum();
            assert_eq!(experts, whole.n_routed_experts, "{name} N={ranks}");
            // the KDA state a rank plans is what its session allocates: its heads' states
            let dims = k3_model::Dims::new(&cfg).unwrap();
            let state: u64 = per.iter().map(|s| s.kda_state_bytes).sum();
            assert_eq!(state, whole.kda_state_bytes, "{name} N={ranks}");
            for (r, s) in per.iter().enumerate() {
                let heads = k3_model::share::Split::Heads(dims.kda_heads)
                    .rows(dims.kda_heads, r, ranks)
                    .len();
                let one = k3_model::KdaState::new(heads, dims.kda_dim, dims.conv_k);
                let floats = (one.recurrent().len() + one.conv().len()) * dims.n_kda();
                assert_eq!(
                    s.kda_state_bytes,
                    floats as u64 * 4,
                    "{name} N={ranks} rank {r}"
                );
            }
            for (r, s) in per.iter().enumerate() {
                for (l, (&a, &w)) in s
                    .layer_run_bytes
                    .iter()
                    .zip(&whole.layer_run_bytes)
                    .enumerate()
                {
                    assert!(a < w, "{name} N={ranks} rank {r} layer {l}: {a} vs {w}");
                }
                assert!(s.head_bytes < whole.head_bytes);
                // vectors of a rank's heads (conv taps, dt_bias) are its share too
                for (&a, &w) in s.widen_bytes.iter().zip(&whole.widen_bytes) {
                    assert!(a <= w, "{name} N={ranks} rank {r}: widen {a} vs {w}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// Any per-rank budget between the smallest and everything, any thread count.
    #[test]
    fn any_per_rank_budget_and_thread_count_is_bit_identical(
        wide in any::<bool>(),
        ranks in 2usize..=3,
        threads in 1usize..=3,
        frac in 0.0f64..=1.0,
    ) {
        let name = if wide { "tiny-k3-wide" } else { "tiny-k3" };
        let between = |r: usize| {
            let (lo, hi) = budget_extremes_rank(&dir(name), r, ranks).unwrap();
            match (lo, hi) {
                (Budget::Split { trunk: t0, cache: c0 }, Budget::Split { trunk: t1, cache: c1 }) => {
                    let mix = |a: u64, b: u64| a + ((b - a) as f64 * frac) as u64;
                    Some(Budget::Split { trunk: mix(t0, t1), cache: mix(c0, c1) })
                }
                other => panic!("splits expected: {other:?}"),
            }
        };
        let runs = group(name, ranks, threads, &between);
        assert_bit_identical(name, &runs, &format!("N={ranks} threads={threads} frac={frac:.2}"));
    }
}

#[test]
fn rank_figures_count_collectives_per_rank() {
    let d = dir("tiny-k3");
    let one = Engine::open(&d, options(1, None, None)).unwrap();
    one.new_session(16).unwrap().feed(&PROMPT).unwrap();
    let figures = one.rank_figures(123).unwrap();
    assert_eq!(figures.len(), 1);
    assert_eq!((figures[0].rank, figures[0].peak_rss_bytes), (0, 123));
    assert_eq!(figures[0].collective_calls, 0);
    let all: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = LocalComm::group(2)
            .into_iter()
            .map(|c| {
                let d = d.clone();
                scope.spawn(move || {
                    let rank = c.rank() as u64;
                    let engine = Engine::open(&d, options(1, None, Some(Arc::new(c)))).unwrap();
                    let before = engine.comm_stats();
                    engine.new_session(16).unwrap().feed(&PROMPT).unwrap();
                    let pass = engine.comm_stats().since(&before);
                    (pass, engine.rank_figures(1000 + rank).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (pass0, figs0) = &all[0];
    assert!(pass0.calls > 0 && pass0.bytes_sent > 0 && pass0.bytes_received > 0);
    // both ranks make the same collectives; each receives what the other sent
    assert_eq!(all[0].0.calls, all[1].0.calls);
    assert_eq!(all[0].0.bytes_received, all[1].0.bytes_sent);
    assert_eq!(all[1].0.bytes_received, all[0].0.bytes_sent);
    assert_eq!(figs0, &all[1].1, "every rank gets the same table");
    assert_eq!(figs0.len(), 2);
    for (q, f) in figs0.iter().enumerate() {
        assert_eq!((f.rank, f.peak_rss_bytes), (q, 1000 + q as u64));
        assert!(f.collective_calls >= all[q].0.calls);
        assert!(f.collective_seconds >= 0.0);
    }
}

/// `k3_model::dist_cost` against what the ranks really exchange (a counting `Comm`): a
/// prompt pass (every position's logits) and a one-token decode pass, call for call and
/// byte for byte, both tiny models, N = 2 and 3.
#[test]
fn dist_cost_counts_what_the_ranks_exchange() {
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let d = dir(name);
        let dims = k3_model::Dims::new(&K3Config::load(d.join("config.json")).unwrap()).unwrap();
        for ranks in [2usize, 3] {
            let per_rank: Vec<_> = std::thread::scope(|scope| {
                let handles: Vec<_> = LocalComm::group(ranks)
                    .into_iter()
                    .map(|c| {
                        let d = d.clone();
                        scope.spawn(move || {
                            let e = Engine::open(&d, options(1, None, Some(Arc::new(c)))).unwrap();
                            let mut s = e.new_session(32).unwrap();
                            let t0 = e.comm_stats();
                            s.feed_all_logits(&PROMPT).unwrap();
                            let t1 = e.comm_stats();
                            s.feed(&[5]).unwrap();
                            (t1.since(&t0), e.comm_stats().since(&t1))
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let n = PROMPT.len();
            let want = [
                k3_model::dist_cost::pass_cost(&dims, ranks, n, n),
                k3_model::dist_cost::pass_cost(&dims, ranks, 1, 1),
            ];
            for (i, want) in want.iter().enumerate() {
                let got = |r: usize| if i == 0 { per_rank[r].0 } else { per_rank[r].1 };
                let sent: u64 = (0..ranks).map(|r| got(r).bytes_sent).sum();
                for r in 0..ranks {
                    assert_eq!(
                        got(r).calls,
                        want.collectives,
                        "{name} N={ranks} pass {i} rank {r}"
                    );
                    assert_eq!(got(r).bytes_sent + got(r).bytes_received, want.bytes());
                }
                assert_eq!(sent, want.bytes(), "{name} N={ranks} pass {i}");
            }
        }
    }
}

/// Without a checkpoint (`k3 plan --ranks N` of the release), per-rank sizes come from the
/// config's layout: on both tiny models they equal the bound checkpoint's, tensor names and
/// shapes included.
#[test]
fn per_rank_sizes_from_the_config_equal_the_bound_checkpoints() {
    use k3_engine::planning::{model_sizes, rank_sizes_of_config, spec_tensors};
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let d = dir(name);
        let cfg = K3Config::load(d.join("config.json")).unwrap();
        let b = bind_model(&Checkpoint::open(&d).unwrap(), &cfg).unwrap();
        let (globals, layers) = spec_tensors(&cfg).unwrap();
        assert_eq!(globals.lm_head.shape, b.globals.lm_head.shape);
        for (got, want) in layers.iter().zip(&b.layers) {
            let shapes = |lt: &k3_format::bind::LayerTensors| -> Vec<(String, Vec<usize>)> {
                lt.tensors()
                    .iter()
                    .map(|t| (t.name.clone(), t.shape.clone()))
                    .collect()
            };
            assert_eq!(shapes(got), shapes(want), "{name} layer {}", want.layer);
        }
        let whole = model_sizes(&cfg, &b).unwrap();
        for ranks in [1usize, 2, 3] {
            let from_config = rank_sizes_of_config(&cfg, &whole, ranks).unwrap();
            assert_eq!(from_config.len(), ranks);
            for (r, got) in from_config.iter().enumerate() {
                assert_eq!(
                    got,
                    &rank_sizes(&cfg, &b, r, ranks).unwrap(),
                    "{name} rank {r} of {ranks}"
                );
            }
        }
    }
}
