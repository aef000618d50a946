//! Peak RSS stays within the memory plan: a ~365 MB synthetic model (`k3_format::synth`, the
//! `cargo xtask gen-bench --mid` shape) runs under a budget of less than a tenth of its size
//! (trunk budget ≈ 1/4 of the trunk, expert cache = 2 × (top-k + 1) slots), and the process's
//! peak RSS (`peak_rss_bytes`, Linux VmHWM) must not exceed the plan's TOTAL plus
//! [`FIXED_OVERHEAD`]. The streamed run must also print the same tokens as a run with a budget
//! that holds everything (same tokens at every budget).
//!
//! What the plan does not count and does not grow with the model — the binary's own pages (a
//! debug build here), the C runtime and allocator arenas, the stacks of the compute and reader
//! threads, the checkpoint index, the few pages of the mmapped embedding rows gathered per
//! token — is measured in the same test: the tiny model's resident run (`k3 run
//! fixtures/tiny-k3 --ids 1,2,3 -n 2 --resident`) is the baseline, and the streamed run may peak
//! at most [`NOISE`] above plan TOTAL + baseline. The baseline is mostly the binary's text pages
//! (the kernel maps pages around each fault, so RSS follows the binary's size): 14.5–15.3 MB in
//! earlier builds, 24.1–25.2 MB on Zen 4 (2026-11) after the binary grew to 22 MB of text
//! (`/proc/PID/smaps`: 18.2 MB of RSS is the k3 binary). A fixed constant went stale as the code
//! grew, so the bound now moves with the binary and nothing else. The mid model's streamed run
//! peaked 4.4–4.9 MB above plan TOTAL earlier, ~10 MB under plan TOTAL + baseline (the plan also counts 7.9 MB of latent KV
//! for ctx 4096 that two tokens never touch). [`NOISE`] = 9 MB of allocator and page-granularity
//! noise; every run uses `--threads 2` so the bound does not depend on the core count. The
//! streamed run therefore fails on any unplanned growth above ~19 MB: a mapped-and-touched expert
//! pool (187 MB), the trunk read through mmap (111 MB), a second copy of the head (34 MB). The
//! baseline itself must stay under [`BASELINE_CEILING`], so a runaway binary is still caught.

use k3_engine::planning::forecast;
use k3_engine::Budget;
use k3_format::synth::{self, SynthSpec};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bytes of peak RSS allowed on top of plan TOTAL + the measured baseline (see the module docs).
const NOISE: u64 = 9_000_000;
/// The most the tiny model's resident run may peak at (debug binary; see the module docs).
const BASELINE_CEILING: u64 = 40_000_000;

/// The CLI's context default when `--ctx` is not given (`k3 run`), which its plan uses.
const CLI_CTX: usize = 4096;

/// Prompt for the mid model (vocab 16,384) and for the tiny one (vocab 1,024).
const PROMPT: &str = "11,222,3333,4444,555";
const TINY_PROMPT: &str = "1,2,3";

/// Removes the directory when dropped (also when an assertion fails).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `k3 run MODEL --ids IDS -n 2 --json … --threads 2 EXTRA` and returns its JSON report.
fn run_k3(model: &Path, ids: &str, json: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "run",
        model.to_str().unwrap(),
        "--ids",
        ids,
        "-n",
        "2",
        "--json",
        json.to_str().unwrap(),
        "--threads",
        "2",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(&args)
        .output()
        .expect("k3 runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "k3 {args:?} failed:\n{err}");
    let text = std::fs::read_to_string(json).expect("JSON report written");
    serde_json::from_str(&text).expect("JSON report parses")
}

/// The CLI's GB → bytes conversion (`--trunk-gb`/`--cache-gb`), so the plan matches exactly.
fn cli_bytes(gb: &str) -> u64 {
    (gb.parse::<f64>().unwrap() * 1e9) as u64
}

#[test]
fn streamed_peak_rss_stays_within_the_plan_and_tokens_match() {
    let tmp = TempDir(std::env::temp_dir().join(format!("k3-peak-rss-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    std::fs::create_dir_all(&tmp.0).unwrap();
    let model = tmp.0.join("mid");

    let mut spec = SynthSpec::new(synth::mid_config(8, 64, 16_384));
    spec.seed = 3;
    spec.shard_bytes = 100_000_000;
    let sum = synth::write_checkpoint(&model, &spec, |_| {}).unwrap();
    assert!(sum.total_bytes >= 200_000_000, "{sum:?}");

    // Budget: a quarter of the trunk, and 2 × (top-k + 1) expert slots.
    let top_k = spec.config.num_experts_per_token as u64;
    let n_experts = (spec.config.num_hidden_layers - spec.config.first_k_dense_replace)
        * spec.config.num_experts;
    let expert = sum.expert_bytes / n_experts as u64;
    let trunk_gb = format!("{:.6}", sum.trunk_bytes as f64 / 4.0 / 1e9);
    let cache_gb = format!(
        "{:.6}",
        (2 * (top_k + 1) * (expert + 2 * 4096)) as f64 / 1e9
    );
    let budget = Budget::Split {
        trunk: cli_bytes(&trunk_gb),
        cache: cli_bytes(&cache_gb),
    };
    let (plan, _, fits) = forecast(&model, budget, CLI_CTX, 1, 0).unwrap();
    fits.unwrap();
    let plan_total = plan.total_bytes();
    assert!(
        3 * (cli_bytes(&trunk_gb) + cli_bytes(&cache_gb)) <= sum.total_bytes,
        "budget {trunk_gb} + {cache_gb} GB is not under a third of the {} B model",
        sum.total_bytes
    );

    // The baseline: the binary, runtime and threads with the tiny model, resident.
    let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
    let base = run_k3(
        &tiny,
        TINY_PROMPT,
        &tmp.0.join("tiny.json"),
        &["--resident"],
    );
    let base_peak = base["peak_rss_bytes"].as_u64().unwrap();
    eprintln!("baseline peak RSS (tiny model, resident) {base_peak} B; noise {NOISE} B");
    assert!(
        base_peak <= BASELINE_CEILING,
        "baseline {base_peak} B exceeds the ceiling {BASELINE_CEILING} B"
    );

    let json = tmp.0.join("streamed.json");
    let streamed = run_k3(
        &model,
        PROMPT,
        &json,
        &["--trunk-gb", &trunk_gb, "--cache-gb", &cache_gb],
    );
    let peak = streamed["peak_rss_bytes"].as_u64().unwrap();
    eprintln!(
        "model {} B (trunk {} B, experts {} B); budget trunk {trunk_gb} GB + cache {cache_gb} GB; plan TOTAL {plan_total} B; peak RSS {peak} B ({:+} B vs plan)",
        sum.total_bytes,
        sum.trunk_bytes,
        sum.expert_bytes,
        peak as i64 - plan_total as i64
    );
    assert!(streamed["streaming"].as_bool().unwrap());
    assert!(
        streamed["bytes_read_trunk"].as_u64().unwrap() > 0,
        "{streamed}"
    );
    assert!(
        streamed["bytes_read_experts"].as_u64().unwrap() > 0,
        "{streamed}"
    );
    assert!(
        peak <= plan_total + base_peak + NOISE,
        "peak RSS {peak} B exceeds plan TOTAL {plan_total} B + baseline {base_peak} B + noise {NOISE} B"
    );

    let big = run_k3(&model, PROMPT, &tmp.0.join("big.json"), &["--mem-gb", "4"]);
    assert_eq!(
        streamed["generated_ids"], big["generated_ids"],
        "tokens differ between budgets"
    );
    assert_eq!(streamed["generated_ids"].as_array().unwrap().len(), 2);
}
