//! The first hour with a real checkpoint, on the tiny model: without a budget flag
//! `run` and `serve` plan against the memory the machine has and say so (a model larger than
//! it is never mapped whole unless `--resident` asks); a prompt plus `-n` past the model's
//! trained context (`max_position_embeddings`) is refused naming both numbers and `-c`; the
//! config file's `ctx`, `n` and `port`; `--json -`; `seconds_per_token` as the decode figure;
//! Ctrl-C during `k3 run` still writes the summary and the report; `-t` past the CPUs warns;
//! `tokenize --file -` reads stdin.

mod common;

use common::{copy_tiny, scratch_dir, stderr, stdout, tiny_arg as tiny, Scratch};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `k3 ARGS` with no config file and `env` set.
fn k3_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env).output().expect("k3 runs")
}

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_k3"));
    c.args(args)
        .envs(env.iter().copied())
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-first-hour-xdg")
        .env("XDG_RUNTIME_DIR", common::test_runtime_dir())
        .stdin(Stdio::null());
    c
}

/// The `generated ids:` line of a `--print-ids` run.
fn ids_line(o: &Output) -> String {
    let err = stderr(o);
    assert!(o.status.success(), "{err}");
    err.lines()
        .find(|l| l.starts_with("generated ids:"))
        .unwrap_or_else(|| panic!("no ids: {err}"))
        .to_string()
}

/// Pretend the machine has 5 MB: less than the tiny model's whole-model plan (about 5.6 MB),
/// more than its smallest plan (about 3 MB).
const SMALL_MACHINE: (&str, &str) = ("K3_MEM_AVAILABLE_GB", "0.005");

#[test]
fn no_budget_flag_plans_against_the_machine_and_says_so() {
    let t = tiny();
    let args = ["run", &t, "--ids", "637,229,263", "-n", "6", "--print-ids"];
    let small = k3_env(&args, &[SMALL_MACHINE]);
    let err = stderr(&small);
    let auto: Vec<&str> = err.lines().filter(|l| l.contains("budget auto")).collect();
    assert_eq!(auto.len(), 1, "one line says what was chosen: {err}");
    assert!(
        auto[0].contains("larger than 90% of the 5.00 MB available")
            && auto[0].contains("planning as --mem-gb 0.0045"),
        "{err}"
    );
    assert!(
        err.contains("memory plan (--mem-gb 0.0045"),
        "the plan is printed: {err}"
    );
    // The whole model is mapped where it fits, and the tokens are the same either way.
    let big = k3_env(&args, &[("K3_MEM_AVAILABLE_GB", "1")]);
    let err_big = stderr(&big);
    assert!(
        err_big.contains("budget auto (no budget flag): the whole model")
            && err_big.contains("mapped resident")
            && !err_big.contains("memory plan"),
        "{err_big}"
    );
    assert_eq!(ids_line(&small), ids_line(&big));
    // --resident maps it whole on the small machine too; a budget flag is used as given.
    let resident = k3_env(&[&args[..], &["--resident"]].concat(), &[SMALL_MACHINE]);
    let err_res = stderr(&resident);
    assert!(
        err_res.contains("--resident: the whole model is mapped resident")
            && !err_res.contains("memory plan ("),
        "{err_res}"
    );
    assert_eq!(ids_line(&resident), ids_line(&big));
    let flagged = k3_env(
        &[&args[..], &["--mem-gb", "0.004"]].concat(),
        &[SMALL_MACHINE],
    );
    assert!(
        !stderr(&flagged).contains("budget auto"),
        "{}",
        stderr(&flagged)
    );
    // -q keeps stderr to errors.
    let quiet = k3_env(&[&args[..6], &["-q"]].concat(), &[SMALL_MACHINE]);
    assert!(
        quiet.status.success() && stderr(&quiet).is_empty(),
        "{}",
        stderr(&quiet)
    );
}

/// Stderr lines of `k3 serve ARGS` up to its `listening on` line (then it is killed).
fn serve_start_lines(args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let mut child = command(args, env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        let done = line.contains("listening on http://");
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn serve_prints_its_plan_at_start() {
    let t = tiny();
    let args = ["serve", &t, "--port", "0", "-t", "2", "-c", "64"];
    // At -c 64 the whole-model plan is about 3.7 MB: pretend 3.5 MB.
    let lines = serve_start_lines(&args, &[("K3_MEM_AVAILABLE_GB", "0.0035")]);
    let text = lines.join("\n");
    assert!(text.contains("listening on"), "{text}");
    assert!(
        text.contains("budget auto") && text.contains("memory plan (--mem-gb"),
        "{text}"
    );
    let preset = serve_start_lines(&[&args[..], &["--preset", "laptop"]].concat(), &[]);
    let text = preset.join("\n");
    assert!(text.contains("memory plan (preset laptop"), "{text}");
    assert!(text.contains("listening on"), "{text}");
}

/// A copy of the tiny model whose config.json says it was trained on `positions` positions.
fn trained_copy(name: &str, positions: u64) -> Scratch {
    let dir = scratch_dir("first-hour", name);
    copy_tiny(&dir);
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["text_config"]["max_position_embeddings"] = positions.into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    dir
}

#[test]
fn past_the_trained_context_is_refused_unless_asked_for() {
    let dir = trained_copy("trained", 16);
    let d = dir.to_str().unwrap();
    // 3 prompt tokens + 20 = 23 positions past 16: refused before anything is fed.
    let o = k3_env(&["run", d, "--ids", "637,229,263", "-n", "20"], &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(stdout(&o).is_empty());
    for needle in [
        "need 23 positions",
        "trained context of 16",
        "-c/--ctx 23",
        "max_position_embeddings",
    ] {
        assert!(err.contains(needle), "{needle:?} in {err}");
    }
    // Within the range it runs, silently.
    let o = k3_env(&["run", d, "--ids", "637,229,263", "-n", "13"], &[]);
    assert!(
        o.status.success() && !stderr(&o).contains("trained"),
        "{}",
        stderr(&o)
    );
    // An explicit -c past it runs, with one warning.
    let o = k3_env(
        &["run", d, "--ids", "637,229,263", "-n", "20", "-c", "32"],
        &[],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        err.matches("past the model's trained context").count(),
        1,
        "{err}"
    );
    // chat: the default context is capped at 16, so -n 64 is refused naming both numbers.
    let o = k3_env(&["chat", d, "--thinking", "off", "-n", "64"], &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("trained context of 16") && err.contains("-c/--ctx"),
        "{err}"
    );
    // serve: an explicit -c past it warns once and serves.
    let lines = serve_start_lines(&["serve", d, "--port", "0", "-c", "64"], &[]);
    let text = lines.join("\n");
    assert_eq!(
        text.matches("past the model's trained context").count(),
        1,
        "{text}"
    );
    assert!(text.contains("listening on"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_file_sets_ctx_n_and_port() {
    let dir = scratch_dir("first-hour", "config");
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!("model = {:?}\nn = 5\nctx = 7\nport = 0\n", tiny()),
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_k3"))
            .args(args)
            .env("K3_CONFIG", &cfg)
            .output()
            .unwrap()
    };
    let o = run(&["run", "--ids", "637,229", "--print-ids", "--ignore-eos"]);
    let line = ids_line(&o);
    assert_eq!(line.split(',').count(), 5, "n = 5: {line}");
    // ctx = 7 counts as an explicit -c: 2 + 6 positions do not fit.
    let o = run(&["run", "--ids", "637,229", "-n", "6"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("the context has 7"), "{}", stderr(&o));
    let o = run(&["config", "show"]);
    let shown = stdout(&o);
    assert!(
        shown.contains("n = 5") && shown.contains("ctx = 7") && shown.contains("port = 0"),
        "{shown}"
    );
    // port = 0 binds a free port.
    let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["serve", "-t", "2"])
        .env("K3_CONFIG", &cfg)
        .env("XDG_RUNTIME_DIR", common::test_runtime_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut listening = String::new();
    while err.read_line(&mut listening).unwrap() > 0 && !listening.contains("listening on") {}
    let _ = child.kill();
    let _ = child.wait();
    assert!(!listening.contains(":8080"), "{listening}");
    assert!(
        listening.contains("listening on http://127.0.0.1:"),
        "{listening}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_dash_writes_the_report_to_stdout_and_seconds_per_token_is_the_decode_figure() {
    let t = tiny();
    let o = k3_env(
        &[
            "run",
            &t,
            "--ids",
            "637,229,263",
            "-n",
            "5",
            "--ignore-eos",
            "--json",
            "-",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!Path::new("-").exists(), "no file named -");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is the report");
    assert_eq!(r["generated_ids"].as_array().unwrap().len(), 5);
    let decode = r["decode"]["seconds"].as_f64().unwrap();
    let per = r["seconds_per_token"].as_f64().unwrap();
    let per_generated = r["seconds_per_generated_token"].as_f64().unwrap();
    // 5 tokens: the first comes from the prompt pass, 4 from decode passes.
    assert!(
        (per * 4.0 - decode).abs() <= 1e-9 * decode.max(1.0),
        "{per} {decode}"
    );
    assert!(
        (per_generated * 5.0 - decode).abs() <= 1e-9 * decode.max(1.0),
        "{per_generated}"
    );
}

#[test]
fn ctrl_c_during_run_still_writes_the_summary_and_the_report() {
    let dir = scratch_dir("first-hour", "ctrlc");
    let json = dir.join("r.json");
    let j = json.to_str().unwrap();
    let t = tiny();
    let args = [
        "run",
        &t,
        "--ids",
        "637",
        "-n",
        "200000",
        "-c",
        "200001",
        "--ignore-eos",
        "--draft",
        "off",
        "--json",
        j,
    ];
    let mut child = command(&args, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    out.read_exact(&mut first)
        .expect("tokens stream before the interrupt");
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
    });
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("stopped: interrupted (Ctrl-C)"), "{err}");
    assert!(err.contains("s/token (decode)"), "the summary line: {err}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["interrupted"], true);
    let n = r["generated_ids"].as_array().unwrap().len();
    assert!(n > 0 && n < 200000, "{n}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn too_many_threads_warn_and_tokenize_reads_stdin() {
    let t = tiny();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let many = (cpus * 4).to_string();
    let o = k3_env(&["run", &t, "--ids", "637", "-n", "2", "-t", &many], &[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("{many} threads on the {cpus} CPUs")),
        "{err}"
    );
    let fine = k3_env(&["run", &t, "--ids", "637", "-n", "2", "-t", "1"], &[]);
    assert!(
        !stderr(&fine).contains("threads on the"),
        "{}",
        stderr(&fine)
    );

    let mut child = command(&["tokenize", &t, "--file", "-"], &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"The train").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "341,464\n");
}
