//! `cargo xtask bench-constraint`: the cost of structured output per generated token
//! (docs/PERFORMANCE.md#structured-output): the time to compute a constraint's mask over the
//! whole vocabulary and apply it to a logits row, and to advance it, for `json_object`, a
//! bounded `json_schema` and a tool call, on the o200k tokenizer with Kimi's specials
//! (~200k ids). Each step picks uniformly among the allowed ids (a random-weight model's
//! worst case: every branch of the grammar gets visited).

use crate::bench_util::{machine_facts, median};
use clap::Args;
use k3_engine::{Constraint, ConstraintSpec, ReplyStart, Tokenizer};
use serde_json::json;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub struct BenchConstraintArgs {
    /// Timed steps per constraint (walks restart when a reply finishes).
    #[arg(long, default_value_t = 2000)]
    steps: usize,
    /// Longest walk before it restarts (an unbounded json_object never finishes on its own).
    #[arg(long, default_value_t = 256)]
    max_walk: usize,
}

pub fn run(args: &BenchConstraintArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-constraint: {e}");
            ExitCode::FAILURE
        }
    }
}

fn tokenizer() -> Result<Tokenizer, String> {
    let data = crate::fuzz::workspace_root().join("crates/k3-tokenizer/tests/data/o200k_kimi");
    Tokenizer::from_tiktoken_files(
        &data.join("o200k_base.tiktoken"),
        &data.join("tokenizer_config.json"),
    )
    .map_err(|e| e.to_string())
}

fn specs() -> Vec<(&'static str, ConstraintSpec)> {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 24 },
            "age": { "type": "integer", "minimum": 0, "maximum": 120 },
            "tags": { "type": "array", "items": { "type": "string", "maxLength": 8 }, "maxItems": 4 },
            "kind": { "enum": ["cat", "dog", "fish"] }
        },
        "required": ["name", "age", "kind"],
        "additionalProperties": false
    });
    let tool = json!({"type": "object", "properties": {
        "query": { "type": "string", "maxLength": 32 },
        "limit": { "type": "integer", "minimum": 1, "maximum": 50 },
        "lang": { "type": "string", "enum": ["en", "fr", "de"] }
    }, "required": ["query"]});
    vec![
        ("json_object", ConstraintSpec::JsonObject),
        (
            "json_schema (bounded)",
            ConstraintSpec::JsonSchema {
                schema,
                strict: true,
            },
        ),
        (
            "tool call (required)",
            ConstraintSpec::ToolCalls {
                tools: vec![("search".into(), tool)],
                named: None,
                parallel: false,
            },
        ),
    ]
}

/// The `q`-quantile (nearest rank) of `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(((s.len() as f64 * q).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}

fn bench(args: &BenchConstraintArgs) -> Result<(), String> {
    println!("{}", machine_facts());
    let t = Instant::now();
    let tok = tokenizer()?;
    let vocab = tok.vocab_size();
    println!(
        "tokenizer: o200k + Kimi specials, {vocab} ids (loaded in {:.2} s)",
        t.elapsed().as_secs_f64()
    );
    println!("| constraint | compile ms | steps | mask µs median | mask µs p90 | mask µs max | advance µs median |");
    println!("|---|---|---|---|---|---|---|");
    for (name, spec) in specs() {
        let t = Instant::now();
        Constraint::new(&tok, &spec, ReplyStart::Response).map_err(|e| e.to_string())?;
        let compile = t.elapsed().as_secs_f64() * 1e3;
        let (mask, advance) = walk(&tok, &spec, args)?;
        println!(
            "| {name} | {compile:.1} | {} | {:.0} | {:.0} | {:.0} | {:.1} |",
            mask.len(),
            median(&mask),
            quantile(&mask, 0.9),
            quantile(&mask, 1.0),
            median(&advance)
        );
    }
    println!(
        "(the first compile also builds the vocabulary's token trie and slices, cached after)"
    );
    Ok(())
}

/// Mask and advance times (µs) over `args.steps` steps of uniform random walks.
fn walk(
    tok: &Tokenizer,
    spec: &ConstraintSpec,
    args: &BenchConstraintArgs,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let vocab = tok.vocab_size();
    let mut logits = vec![0.0f32; vocab];
    let (mut mask_us, mut advance_us) = (Vec::new(), Vec::new());
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    while mask_us.len() < args.steps {
        let mut c = Constraint::new(tok, spec, ReplyStart::Response).map_err(|e| e.to_string())?;
        for _ in 0..args.max_walk {
            logits.fill(0.0);
            let t = Instant::now();
            c.mask(&mut logits).map_err(|e| e.to_string())?;
            mask_us.push(t.elapsed().as_secs_f64() * 1e6);
            let allowed: Vec<u32> = (0..vocab as u32)
                .filter(|&i| logits[i as usize].is_finite())
                .collect();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let id = allowed[(state % allowed.len() as u64) as usize];
            if id == c.end_id() || mask_us.len() >= args.steps {
                break;
            }
            let t = Instant::now();
            c.advance(id).map_err(|e| e.to_string())?;
            advance_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok((mask_us, advance_us))
}
