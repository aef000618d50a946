//! Benchmark driver (not a test): load time and encode throughput of one tokenizer on one file.
//!
//! ```text
//! cargo run --release -p k3-tokenizer --example tokenizer_bench -- \
//!     MODEL CONFIG TEXT_FILE [RUNS]
//! ```
//! Prints one JSON object: `load_ms` (median of the loads), and for the whole file in one
//! `encode_ordinary` call (`file_*`) and one call per line (`lines_*`): MB/s best and median
//! over RUNS and the id count. `tools/tokenizer/bench.py` runs it beside Python tiktoken.

use std::path::Path;
use std::time::Instant;

use k3_tokenizer::Tokenizer;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, config, text_file, rest @ ..] = args.as_slice() else {
        return Err("usage: tokenizer_bench MODEL CONFIG TEXT_FILE [RUNS]".into());
    };
    let runs: usize = rest.first().map_or(Ok(5), |r| r.parse())?;
    let mut loads = Vec::new();
    let mut tok = None;
    for _ in 0..runs.max(3) {
        let t = Instant::now();
        tok = Some(Tokenizer::from_tiktoken_files(
            Path::new(model),
            Path::new(config),
        )?);
        loads.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let tok = tok.ok_or("no load")?;
    let text = std::fs::read_to_string(text_file)?;
    let mb = text.len() as f64 / 1e6;
    // Whole file in one call, then one call per line (no reuse across lines).
    let whole = |t: &str| tok.encode_ordinary(t).len();
    let lines = |t: &str| {
        t.split_inclusive('\n')
            .map(|l| tok.encode_ordinary(l).len())
            .sum()
    };
    let mut fields = vec![format!("\"load_ms\": {:.1}", median(loads))];
    for (name, f) in [
        ("file", &whole as &dyn Fn(&str) -> usize),
        ("lines", &lines),
    ] {
        let mut speeds = Vec::new();
        let mut n_ids = 0;
        for _ in 0..runs {
            let t = Instant::now();
            n_ids = std::hint::black_box(f(&text));
            speeds.push(mb / t.elapsed().as_secs_f64());
        }
        let best = speeds.iter().copied().fold(0.0, f64::max);
        fields.push(format!("\"{name}_mb_s_best\": {best:.2}"));
        fields.push(format!("\"{name}_mb_s_median\": {:.2}", median(speeds)));
        fields.push(format!("\"{name}_n_ids\": {n_ids}"));
    }
    fields.push(format!("\"bytes\": {}", text.len()));
    println!("{{{}}}", fields.join(", "));
    Ok(())
}
