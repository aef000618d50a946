//! `cargo xtask bench-compute --model DIR --cold`: what first touches cost a freshly opened
//! engine, per phase, under each buffer policy (docs/PERFORMANCE.md#cold-start).
//!
//! One process opens the model once per (round, policy), policies alternating within a
//! round, and times five phases: open (pinned trunk read, buffers made), the first prefill
//! of the long prompt (cold: ring slots, cache slots, scratch and KV touched for the first
//! time), the first decode steps after it, the same prompt again in a new session (warm) and
//! as many decode steps after that. Each phase records wall seconds and, from
//! `/proc/self/stat`, the process's minor and major page faults and its user and system CPU
//! seconds (every thread; the kernel's fault handling and page zeroing is system time).
//! Every engine is dropped before the next opens, so its anonymous buffers are returned and
//! the next engine's are fresh; shard files are read with O_DIRECT (streaming budgets) or
//! memory-mapped with a warm page cache (`--cold-budget mapped`).
//!
//! Policies ([`BufferPolicy`]): `heap` (the zeroed `Vec` backing k3 used before), `map`
//! (anonymous maps, 4 KiB pages), `huge` (maps advised for transparent huge pages), and any
//! of them `+prefault` (the expert cache's slots populated on a background thread at open).

use crate::bench_util::{self, median, prompt_ids};
use clap::Args;
use k3_engine::{argmax, Budget, DecodeMode, Engine, EngineOptions};
use k3_store::BufferPolicy;
use std::path::Path;
use std::time::Instant;

/// Flags of the cold-start measurement (part of `bench-compute`).
#[derive(Args, Debug)]
pub struct ColdArgs {
    /// With `--model`: measure cold start per buffer policy instead of the prefill marginal.
    #[arg(long)]
    pub cold: bool,
    /// Budget of the cold runs: `mapped` (no budget, shards memory-mapped) or one of
    /// bench-decode's `resident`, `pinned`, `half`, `smallest`.
    #[arg(long, default_value = "pinned")]
    pub cold_budget: String,
    /// Rounds; each opens the model once per policy, policies alternating.
    #[arg(long, default_value_t = 3)]
    pub cold_rounds: usize,
    /// Policies compared: `heap`, `map`, `huge`, each optionally `+prefault`.
    #[arg(long, value_delimiter = ',', default_value = "heap,huge+prefault")]
    pub cold_policies: Vec<String>,
}

/// Process counters from `/proc/self/stat` at one instant.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    wall: f64,
    minflt: f64,
    majflt: f64,
    user_s: f64,
    sys_s: f64,
}

/// `/proc/[pid]/stat` reports CPU times in USER_HZ ticks, 100 per second on Linux.
const USER_HZ: f64 = 100.0;

fn counters(t0: Instant) -> Counters {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name start at field 3 (state).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let at = |field: usize| f.get(field - 3).copied().unwrap_or(0.0);
    Counters {
        wall: t0.elapsed().as_secs_f64(),
        minflt: at(10),
        majflt: at(12),
        user_s: at(14) / USER_HZ,
        sys_s: at(15) / USER_HZ,
    }
}

impl std::ops::Sub for Counters {
    type Output = Counters;
    fn sub(self, o: Counters) -> Counters {
        Counters {
            wall: self.wall - o.wall,
            minflt: self.minflt - o.minflt,
            majflt: self.majflt - o.majflt,
            user_s: self.user_s - o.user_s,
            sys_s: self.sys_s - o.sys_s,
        }
    }
}

const PHASES: [&str; 5] = [
    "open",
    "prefill cold",
    "decode cold",
    "prefill warm",
    "decode warm",
];

/// One run: the five phases' deltas, peak RSS and anonymous huge pages at the end, ids.
struct Run {
    phases: [Counters; 5],
    peak_rss_kb: f64,
    anon_huge_kb: f64,
    ids: Vec<u32>,
}

/// A `kB` field of a `/proc/self/…` file.
fn proc_kb(file: &str, key: &str) -> f64 {
    let s = std::fs::read_to_string(file).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn parse_policy(name: &str) -> Result<BufferPolicy, String> {
    let (base, prefault) = match name.strip_suffix("+prefault") {
        Some(b) => (b, true),
        None => (name, false),
    };
    let (anon_map, huge_pages) = match base {
        "heap" => (false, false),
        "map" => (true, false),
        "huge" => (true, true),
        _ => {
            return Err(format!(
            "--cold-policies: unknown policy {name:?} (heap, map, huge, each optionally +prefault)"
        ))
        }
    };
    Ok(BufferPolicy {
        anon_map,
        huge_pages,
        prefault,
    })
}

fn budget_named(dir: &Path, name: &str) -> Result<Option<Budget>, String> {
    if name == "mapped" {
        return Ok(None);
    }
    let m = bench_util::model_info(dir)?;
    crate::bench_decode::budgets(&m, dir)?
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| Some(b))
        .ok_or_else(|| {
            format!("--cold-budget {name:?}: use mapped, resident, pinned, half or smallest")
        })
}

/// Opens `dir` under `opts` and times the five phases.
fn one_run(dir: &Path, opts: EngineOptions, long: usize, steps: usize) -> Result<Run, String> {
    // Resets VmHWM (Linux ≥ 4.0) so the peak is this run's; ignored where refused.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let t0 = Instant::now();
    let mut marks = vec![counters(t0)];
    let engine = Engine::open(dir, opts).map_err(|e| e.to_string())?;
    marks.push(counters(t0));
    let prompt = prompt_ids(long, engine.config().vocab_size, 7);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut s = engine
            .new_session(long + steps + 1)
            .map_err(|e| e.to_string())?;
        s.feed(&prompt).map_err(|e| e.to_string())?;
        marks.push(counters(t0));
        for _ in 0..steps {
            let id = argmax(s.logits());
            ids.push(id);
            s.step(id, DecodeMode::Incremental)
                .map_err(|e| e.to_string())?;
        }
        marks.push(counters(t0));
    }
    let anon_huge_kb = proc_kb("/proc/self/smaps_rollup", "AnonHugePages:");
    let peak_rss_kb = proc_kb("/proc/self/status", "VmHWM:");
    let phases = std::array::from_fn(|i| marks[i + 1] - marks[i]);
    Ok(Run {
        phases,
        peak_rss_kb,
        anon_huge_kb,
        ids,
    })
}

/// The cold-start table (see the module docs).
pub fn bench_cold(
    args: &ColdArgs,
    dir: &Path,
    threads: usize,
    prompts: &[usize],
    steps: usize,
) -> Result<(), String> {
    let long = *prompts.last().ok_or("--prompts is empty")?;
    let policies: Vec<(String, BufferPolicy)> = args
        .cold_policies
        .iter()
        .map(|n| parse_policy(n).map(|p| (n.clone(), p)))
        .collect::<Result<_, _>>()?;
    let budget = budget_named(dir, &args.cold_budget)?;
    let load0 = bench_util::load_average();
    let thp = k3_store::thp_mode().unwrap_or_else(|| "absent".into());
    println!(
        "cold start: {} ({threads} threads, budget {}, prompt {long}, {steps} decode steps, THP {thp})",
        dir.display(),
        args.cold_budget
    );
    let mut runs: Vec<Vec<Run>> = policies.iter().map(|_| Vec::new()).collect();
    for round in 0..args.cold_rounds.max(1) {
        for (i, (name, policy)) in policies.iter().enumerate() {
            policy.install();
            let opts = EngineOptions {
                threads: Some(threads),
                budget,
                ctx: long + steps + 1,
                direct_io: true,
                ..EngineOptions::default()
            };
            let run = one_run(dir, opts, long, steps)?;
            let p = &run.phases;
            eprintln!(
                "round {round} {name}: open {:.2} s (sys {:.2}), prefill cold {:.2} (sys {:.2}) / warm {:.2} s, {:.0} / {:.0} / {:.0} minflt",
                p[0].wall, p[0].sys_s, p[1].wall, p[1].sys_s, p[3].wall, p[0].minflt, p[1].minflt, p[3].minflt
            );
            runs[i].push(run);
        }
    }
    BufferPolicy::default().install();
    print_table(&policies, &runs)?;
    println!("load average: {load0} → {}", bench_util::load_average());
    Ok(())
}

fn print_table(policies: &[(String, BufferPolicy)], runs: &[Vec<Run>]) -> Result<(), String> {
    let first_ids = &runs[0][0].ids;
    if let Some(bad) = runs.iter().flatten().find(|r| &r.ids != first_ids) {
        return Err(format!(
            "ids differ between buffer policies: {:?} vs {first_ids:?}",
            bad.ids
        ));
    }
    println!("medians of {} runs per policy", runs[0].len());
    println!("| policy | phase | wall s | minor faults | major faults | user s | sys s |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for ((name, _), rs) in policies.iter().zip(runs) {
        for (k, phase) in PHASES.iter().enumerate() {
            let med = |f: &dyn Fn(&Counters) -> f64| {
                median(&rs.iter().map(|r| f(&r.phases[k])).collect::<Vec<_>>())
            };
            println!(
                "| {name} | {phase} | {:.3} | {:.0} | {:.0} | {:.2} | {:.2} |",
                med(&|c| c.wall),
                med(&|c| c.minflt),
                med(&|c| c.majflt),
                med(&|c| c.user_s),
                med(&|c| c.sys_s)
            );
        }
    }
    for ((name, _), rs) in policies.iter().zip(runs) {
        let rss = median(&rs.iter().map(|r| r.peak_rss_kb).collect::<Vec<_>>());
        let huge = median(&rs.iter().map(|r| r.anon_huge_kb).collect::<Vec<_>>());
        println!(
            "{name}: peak RSS {:.3} GB, anonymous huge pages at the end {:.3} GB",
            rss * 1024.0 / 1e9,
            huge * 1024.0 / 1e9
        );
    }
    println!("greedy ids (identical under every policy): {first_ids:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_unknown_names_are_refused() {
        let p = parse_policy("huge+prefault").unwrap();
        assert!(p.anon_map && p.huge_pages && p.prefault);
        assert_eq!(
            parse_policy("heap").unwrap(),
            BufferPolicy {
                anon_map: false,
                huge_pages: false,
                prefault: false
            }
        );
        let e = parse_policy("hugepages").unwrap_err();
        assert!(
            e.contains("hugepages") && e.contains("heap, map, huge"),
            "{e}"
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn counters_see_this_process_fault() {
        let t0 = Instant::now();
        let a = counters(t0);
        // 64 MiB of fresh pages, written: at least 16,384 faults of 4 KiB (or 32 of 2 MiB).
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let b = counters(t0);
        assert!(v[12345] == 1);
        assert!(b.minflt - a.minflt >= 32.0, "{a:?} → {b:?}");
        assert!(b.wall >= a.wall);
    }
}
