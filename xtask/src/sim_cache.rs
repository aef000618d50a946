//! `cargo xtask sim-cache TRACE`: replay a recorded expert trace through every cache policy
//! at a ladder of capacities (results and the policy decision: docs/PERFORMANCE.md).

use k3_plan::plan::{ModelSizes, Preset, GB};
use k3_plan::sim::{simulate, Trace};
use k3_plan::{KeySpace, PolicyKind};
use std::path::Path;
use std::process::ExitCode;

/// Capacities replayed by default (experts); the presets' cache sizes are added.
const LADDER: [usize; 12] = [
    17, 30, 60, 120, 250, 500, 1000, 2000, 4000, 6000, 8000, 10010,
];

/// Options of the subcommand.
pub struct Options<'a> {
    /// Trace file.
    pub trace: &'a Path,
    /// Capacities in experts; empty = the default ladder plus the presets.
    pub capacities: &'a [usize],
    /// Policies; empty = all.
    pub policies: &'a [PolicyKind],
    /// Experts per token per layer.
    pub top_k: usize,
}

/// Runs the subcommand.
pub fn run(opts: &Options) -> ExitCode {
    match replay(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sim-cache: {e}");
            ExitCode::FAILURE
        }
    }
}

fn replay(opts: &Options) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::read(opts.trace)
        .map_err(|e| format!("cannot read {}: {e}", opts.trace.display()))?;
    let trace = Trace::parse(&bytes, KeySpace::K3, opts.top_k)?;
    let s = trace.summary();
    println!(
        "trace {}: {} bytes, {} records (u32 layer, u32 expert, LE)",
        opts.trace.display(),
        bytes.len(),
        s.requests
    );
    println!(
        "  layers {}..={} ({} distinct), experts 0..={}, {} distinct keys",
        s.layers.0, s.layers.1, s.n_layers_seen, s.max_expert, s.distinct
    );
    println!(
        "  {} passes of {:?} tokens; batches of top-k {} distinct: {}; each pass repeats the previous as its prefix: {}",
        s.pass_tokens.len(), s.pass_tokens, opts.top_k, s.batches_distinct, s.prefix_consistent
    );
    let policies = if opts.policies.is_empty() {
        PolicyKind::all()
    } else {
        opts.policies.to_vec()
    };
    let caps = capacities(opts.capacities);
    println!("\nfull trace (full recompute of every step, as recorded):");
    table(&trace, &caps, &policies)?;
    if let Some(decode) = trace.decode_view() {
        println!("\ndecode view (prefill = first pass, then only each later pass's newest token):");
        table(&decode, &caps, &policies)?;
    }
    Ok(())
}

/// The ladder (or the user's list) plus the presets' expert-cache sizes, sorted.
fn capacities(user: &[usize]) -> Vec<(usize, String)> {
    if !user.is_empty() {
        return user.iter().map(|&c| (c, String::new())).collect();
    }
    let slot = ModelSizes::k3_estimate().expert_slot_bytes();
    let mut caps: Vec<(usize, String)> = LADDER.iter().map(|&c| (c, String::new())).collect();
    for p in Preset::ALL {
        let c = (p.gb().1 * GB / slot) as usize;
        match caps.iter_mut().find(|(x, _)| *x == c) {
            Some((_, label)) => label.push_str(&format!(" {p}")),
            None => caps.push((c, p.name().to_string())),
        }
    }
    caps.sort();
    caps
}

fn table(
    trace: &Trace,
    caps: &[(usize, String)],
    policies: &[PolicyKind],
) -> Result<(), Box<dyn std::error::Error>> {
    let sizes = ModelSizes::k3_estimate();
    let summary = trace.summary();
    let tokens = summary.token_forwards(trace.top_k);
    println!(
        "  {} requests = {tokens:.0} token-forwards of {} layers x {}; cells: hit % / GB read per token-forward",
        summary.requests, summary.n_layers_seen, trace.top_k
    );
    let mut head = format!("  {:>6} {:>8} {:<12}", "slots", "GB", "preset");
    for p in policies {
        head.push_str(&format!(" | {:>14}", p.to_string()));
    }
    println!("{head}");
    for (cap, label) in caps {
        let gb = (*cap as u64 * sizes.expert_bytes) as f64 / 1e9;
        let mut row = format!("  {cap:>6} {gb:>8.2} {label:<12}");
        for &p in policies {
            let st = simulate(trace, *cap, p)?;
            let read = st.misses as f64 * sizes.expert_bytes as f64 / 1e9 / tokens;
            row.push_str(&format!(" | {:>5.1}% {:>6.2}", 100.0 * st.hit_rate(), read));
        }
        println!("{row}");
    }
    Ok(())
}
