//! `cargo xtask fuzz TARGET [--seconds N] [--seed S]`: a self-contained mutation fuzzer
//! (stable Rust, no `cargo fuzz`). Seeds are valid inputs generated in-process (plus the tiny
//! fixtures' files); each exec mutates a corpus entry, runs the target under
//! `catch_unwind`, and a watchdog thread flags an input that runs longer than `--timeout`.
//! Every panicking input is saved to `--out` (default `target/fuzz/TARGET`); inputs whose
//! refusal message is new join the corpus (cheap output-diversity guidance, as there is no
//! coverage instrumentation on stable). An input that aborts the process (allocation
//! failure, stack overflow) is written to `abort-input.bin` by a signal handler first.

mod abort_guard;
mod mutate;
mod target_codec;
mod targets;
mod targets_engine;

use mutate::Rng;
use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Names accepted by `cargo xtask fuzz`.
pub const TARGETS: &[&str] = &[
    "safetensors",
    "config",
    "tiktoken",
    "session",
    "serve",
    "trunk-chunk",
];

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// safetensors | config | tiktoken | session | serve | trunk-chunk
    pub target: String,
    /// How long to run.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Mutation seed (same seed, same inputs).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this many execs (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub runs: u64,
    /// Where crashing inputs are written (default target/fuzz/TARGET).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seconds one input may run before it counts as a hang.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
}

/// One fuzz target: seeds, keywords, optional structure-aware mutation, and the run itself.
pub trait Target {
    fn seeds(&self) -> Vec<Vec<u8>>;
    fn dict(&self) -> Vec<&'static [u8]> {
        Vec::new()
    }
    /// Mutation aware of the input's structure (re-sealed checksums, fixed length prefixes);
    /// `None` falls back to the generic byte/JSON mutations.
    fn mutate(&self, _input: &[u8], _rng: &mut Rng) -> Option<Vec<u8>> {
        None
    }
    /// Runs one input: `Err` is a refusal (fine); a panic or a violated invariant is a crash.
    fn run(&self, input: &[u8]) -> Result<(), String>;
}

pub fn make_target(name: &str) -> Result<Box<dyn Target>, String> {
    match name {
        "safetensors" => Ok(Box::new(targets::Safetensors)),
        "config" => Ok(Box::new(targets::Config::new()?)),
        "tiktoken" => Ok(Box::new(targets::Tiktoken::new()?)),
        "session" => Ok(Box::new(targets_engine::SessionFile::new()?)),
        "serve" => Ok(Box::new(targets_engine::Serve::new()?)),
        "trunk-chunk" => Ok(Box::new(target_codec::TrunkChunk)),
        other => Err(format!(
            "unknown fuzz target `{other}` (known: {})",
            TARGETS.join(", ")
        )),
    }
}

/// What a campaign did.
#[derive(Debug, Default)]
pub struct Report {
    pub execs: u64,
    pub secs: f64,
    pub crashes: u64,
    pub unique: BTreeMap<String, u64>,
    pub corpus: usize,
    pub refusals: usize,
    /// Inputs the target accepted (and whose invariants held).
    pub accepted: u64,
}

thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

pub fn run(args: &FuzzArgs) -> ExitCode {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/fuzz").join(&args.target));
    match campaign(args, &out, true) {
        Ok(r) => {
            if r.crashes > 0 {
                eprintln!(
                    "fuzz: {} crashing inputs saved in {}",
                    r.crashes,
                    out.display()
                );
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("fuzz: {e}");
            ExitCode::from(2)
        }
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs one campaign; `verbose` prints a status line every 10 seconds.
pub fn campaign(args: &FuzzArgs, out: &Path, verbose: bool) -> Result<Report, String> {
    campaign_with(args, out, verbose, &|| make_target(&args.target))
}

/// Campaigns run one at a time per process (the panic hook and the allocation guard are
/// process-wide).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

type Factory<'a> = &'a dyn Fn() -> Result<Box<dyn Target>, String>;

/// [`campaign`] with the target built by `make` (again after every crash).
pub fn campaign_with(
    args: &FuzzArgs,
    out: &Path,
    verbose: bool,
    make: Factory<'_>,
) -> Result<Report, String> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut target = make()?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut rng = Rng::new(args.seed);
    let mut corpus = target.seeds();
    if corpus.is_empty() {
        return Err(format!("target {} has no seeds", args.target));
    }
    let dict = target.dict();
    let mut seen: HashSet<String> = HashSet::new();
    let mut report = Report::default();

    // Panics are recorded (location + message), not printed.
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let loc = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{loc}: {msg}")));
    }));

    // Watchdog: the current input and when it started.
    let current: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new(Vec::new()));
    let started_ms = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let dog = {
        let (current, started_ms, done) = (current.clone(), started_ms.clone(), done.clone());
        let (out, timeout, name) = (out.to_path_buf(), args.timeout * 1000, args.target.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let s = started_ms.load(Ordering::Relaxed);
                let now = t0.elapsed().as_millis() as u64;
                if s != 0 && now.saturating_sub(s) > timeout {
                    let input = current.lock().map(|g| g.clone()).unwrap_or_default();
                    let path = out.join(format!("hang-{:016x}.bin", fnv(&input)));
                    let _ = std::fs::write(&path, &input);
                    eprintln!(
                        "fuzz {name}: HANG: an input ran over {} s; saved {}",
                        timeout / 1000,
                        path.display()
                    );
                    std::process::exit(3);
                }
            }
        })
    };
    abort_guard::arm(out);

    let deadline = t0 + Duration::from_secs(args.seconds);
    let mut last_status = Instant::now();
    while Instant::now() < deadline && (args.runs == 0 || report.execs < args.runs) {
        let base = rng.pick(&corpus).clone();
        let input = match target.mutate(&base, &mut rng) {
            Some(m) if !rng.chance(4) => m,
            _ => mutate::mutate(&base, &corpus, &dict, &mut rng),
        };
        if let Ok(mut g) = current.lock() {
            g.clone_from(&input);
        }
        abort_guard::set_current(&input);
        started_ms.store(t0.elapsed().as_millis().max(1) as u64, Ordering::Relaxed);
        let result = catch_unwind(AssertUnwindSafe(|| target.run(&input)));
        started_ms.store(0, Ordering::Relaxed);
        report.execs += 1;
        match result {
            Ok(Ok(())) => report.accepted += 1,
            Ok(Err(msg)) => {
                let class = error_class(&msg);
                if seen.insert(class) {
                    report.refusals += 1;
                    if corpus.len() < 2000 {
                        corpus.push(input);
                    }
                }
            }
            Err(_) => {
                let sig = LAST_PANIC
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_else(|| "unknown panic".into());
                let key = sig.split(": ").next().unwrap_or("").to_string();
                let n = report.unique.entry(key).or_insert(0);
                *n += 1;
                report.crashes += 1;
                let path = out.join(format!("crash-{:016x}.bin", fnv(&input)));
                if *n <= 20 {
                    let _ = std::fs::write(&path, &input);
                }
                if *n == 1 && verbose {
                    eprintln!(
                        "fuzz {}: CRASH {sig}\n  saved {}",
                        args.target,
                        path.display()
                    );
                }
                // The target may hold poisoned state after a panic: rebuild it.
                target = make()?;
            }
        }
        if verbose && last_status.elapsed() >= Duration::from_secs(10) {
            last_status = Instant::now();
            status_line(
                &args.target,
                &report,
                t0.elapsed().as_secs_f64(),
                corpus.len(),
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    abort_guard::disarm(out);
    let _ = dog.join();
    std::panic::set_hook(prev_hook);
    report.secs = t0.elapsed().as_secs_f64();
    report.corpus = corpus.len();
    if verbose {
        status_line(&args.target, &report, report.secs, corpus.len());
        for (k, n) in &report.unique {
            println!("  crash site {k}: {n} inputs");
        }
    }
    Ok(report)
}

fn status_line(name: &str, r: &Report, secs: f64, corpus: usize) {
    println!(
        "fuzz {name}: {} execs in {:.0} s ({:.0} execs/s), {} crashes ({} unique), {} accepted, corpus {corpus}, {} refusal classes",
        r.execs,
        secs,
        r.execs as f64 / secs.max(1e-9),
        r.crashes,
        r.unique.len(),
        r.accepted,
        r.refusals
    );
}

/// A refusal message with numbers, hex values and quoted names blanked: one class per kind
/// of refusal.
fn error_class(msg: &str) -> String {
    let mut out = String::with_capacity(96);
    let mut quoted = false;
    for word in msg.split_whitespace() {
        let q = word.matches(['"', '`']).count();
        if !quoted && !word.chars().any(|c| c.is_ascii_digit()) {
            out.push_str(if q > 0 { "\"\"" } else { word });
            out.push(' ');
        }
        quoted ^= q % 2 == 1;
        if out.len() >= 80 {
            break;
        }
    }
    out
}

pub fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few hundred execs of every target with a fixed seed: the harness (seeds, mutators,
    /// targets, crash bookkeeping) must keep working, and the targets must not crash.
    #[test]
    fn every_target_survives_a_short_deterministic_campaign() {
        for name in TARGETS {
            let out =
                std::env::temp_dir().join(format!("k3-fuzz-smoke-{}-{name}", std::process::id()));
            let args = FuzzArgs {
                target: name.to_string(),
                seconds: 60,
                seed: 42,
                runs: if *name == "session" { 150 } else { 300 },
                out: None,
                timeout: 30,
            };
            let r = campaign(&args, &out, false).unwrap();
            let _ = std::fs::remove_dir_all(&out);
            assert_eq!(r.execs, args.runs, "{name}: every exec ran");
            assert_eq!(r.crashes, 0, "{name}: crashes {:?}", r.unique);
            assert!(
                r.refusals > 1,
                "{name}: mutations reach several refusal paths"
            );
        }
    }

    /// Panics only on inputs holding the byte 0xFF.
    struct Picky;
    impl Target for Picky {
        fn seeds(&self) -> Vec<Vec<u8>> {
            vec![b"abc".to_vec()]
        }
        fn run(&self, input: &[u8]) -> Result<(), String> {
            if input.contains(&0xff) {
                panic!("picky saw 0xff");
            }
            Err(format!("refused {}", input.len() % 3))
        }
    }

    #[test]
    fn a_panicking_target_is_caught_counted_and_saved() {
        let out = std::env::temp_dir().join(format!("k3-fuzz-picky-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let args = FuzzArgs {
            target: "picky".into(),
            seconds: 60,
            seed: 3,
            runs: 2000,
            out: None,
            timeout: 30,
        };
        let r = campaign_with(&args, &out, false, &|| Ok(Box::new(Picky))).unwrap();
        assert_eq!(r.execs, 2000);
        assert!(r.crashes > 0, "0xff is a frequent mutation");
        assert_eq!(r.unique.len(), 1, "one crash site: {:?}", r.unique);
        let saved: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!saved.is_empty());
        for p in &saved {
            assert!(
                std::fs::read(p).unwrap().contains(&0xff),
                "{} is a crashing input",
                p.display()
            );
        }
        let _ = std::fs::remove_dir_all(&out);
        assert!(make_target("nope").is_err());
        assert_eq!(error_class("a 12 \"x 1\" 0xff b"), "a \"\" b ");
    }
}
