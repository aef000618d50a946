//! The steps of docs/QUICKSTART.md on the tiny model: the command `k3 doctor` recommends runs
//! exactly as printed, and `k3 presets` gives each preset's RAM and predicted s/token.

mod common;

use common::{k3, tiny_arg};
use std::process::Command;

#[test]
fn the_command_doctor_recommends_runs_verbatim() {
    let o = k3(&["doctor", &tiny_arg(), "--io-seconds", "0.05"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("recommended: "))
        .unwrap_or_else(|| panic!("no recommendation: {out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[..2], ["k3", "run"], "{line}");
    let run = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(&words[1..])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "`{line}` failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(!run.stdout.is_empty());
}

#[test]
fn presets_show_ram_and_predicted_speed() {
    for args in [vec!["presets"], vec!["presets", &tiny_arg()]] {
        let o = k3(&args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let header = out.lines().next().unwrap();
        assert!(
            header.contains("RAM") && header.contains("s/token"),
            "{out}"
        );
        let laptop = out.lines().find(|l| l.starts_with("laptop")).unwrap();
        assert!(laptop.contains("GB") || laptop.contains("MB"), "{laptop}");
        assert!(laptop.contains("≥ "), "{laptop}");
        // the I/O floor from a compressed trunk beside the plain one
        assert!(header.contains("compressed"), "{out}");
        assert_eq!(laptop.matches("≥ ").count(), 2, "{laptop}");
        assert!(out.contains("stored ratio 0.667"), "{out}");
    }
    let o = k3(&["presets", "--read-gbps", "0"]);
    assert_eq!(o.status.code(), Some(2));
}

/// docs/QUICKSTART.md, from the repository root.
fn quickstart_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/QUICKSTART.md")
}

/// `at least` seconds as the QUICKSTART's time table shows them.
fn duration(secs: f64) -> String {
    match secs {
        s if s < 90.0 => format!("{s:.0} s"),
        s if s < 90.0 * 60.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// The time table generated from `k3 presets`' output: per preset its RAM, the s/token floor,
/// a first run (`-n 32`: one prompt pass and 31 decode passes) and a 256-token reply.
fn times_table(presets: &str) -> String {
    let mut t = String::from(
        "| preset | RAM | s/token (floor) | first run, `-n 32` | a 256-token chat reply |\n|---|---|---|---|---|\n",
    );
    for line in presets.lines().skip(1).take_while(|l| !l.trim().is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let per: f64 = w.last().unwrap().parse().unwrap();
        let ram = format!("{} {}", w[3], w[4]);
        t.push_str(&format!(
            "| {} | {ram} | ≥ {per:.2} | ≥ {} | ≥ {} |\n",
            w[0],
            duration(32.0 * per),
            duration(256.0 * per)
        ));
    }
    t
}

/// `text` with the block after the `<!-- generated: NAME -->` line replaced by `block`.
fn with_block(text: &str, name: &str, block: &str) -> String {
    let start = format!("<!-- generated: {name} -->\n");
    let i = text.find(&start).unwrap_or_else(|| panic!("no {start:?}")) + start.len();
    let j = i + text[i..].find("<!-- end generated -->").unwrap();
    format!("{}{block}{}", &text[..i], &text[j..])
}

/// The presets table and the time table in QUICKSTART are `k3 presets`' output and what
/// follows from it, and the RAM the "What you need" table names is the laptop preset's: not
/// copied by hand (`K3_BLESS=1` rewrites them).
#[test]
fn quickstart_preset_tables_are_generated_from_k3_presets() {
    let o = k3(&["presets"]);
    assert!(o.status.success());
    let presets = String::from_utf8(o.stdout).unwrap();
    let laptop_ram = {
        let w: Vec<&str> = presets.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(w[0], "laptop", "{presets}");
        format!("about {} {} at the smallest preset", w[3], w[4])
    };
    let path = quickstart_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut want = with_block(
        &text,
        "k3 presets",
        &format!("```\n$ k3 presets\n{presets}```\n"),
    );
    want = with_block(&want, "times from k3 presets", &times_table(&presets));
    let at = want.find("| RAM | about ").unwrap() + "| RAM | ".len();
    let end = at + want[at..].find(" (`laptop`").unwrap();
    want.replace_range(at..end, &laptop_ram);
    if std::env::var_os("K3_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    assert!(
        text == want,
        "docs/QUICKSTART.md's generated tables differ from `k3 presets`: run K3_BLESS=1 cargo test -p k3-cli --test cli_quickstart"
    );
}

/// The words of one shell command line: whitespace-separated, with '…' and "…" quoting.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => (quote, any) = (Some(c), true),
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

/// Every `k3` command in QUICKSTART's `sh` blocks runs as printed on the tiny model (the
/// model path and the `/nvme/` scratch paths swapped, `--port 8080` made `--port 0`); not
/// run: `k3 download` and `k3 pull` (the network), the commands on the pulled `Kimi-K3` (cli_store.rs
/// runs pull, list, show, run NAME and rm against a fake hub), `pack --adopt` (needs upstream's
/// packer) and `curl`.
/// `chat` reads `/exit`; `serve` must print its plan and start listening.
#[test]
fn quickstart_commands_run_as_printed_on_the_tiny_model() {
    let text = std::fs::read_to_string(quickstart_path()).unwrap();
    let scratch = std::env::temp_dir().join(format!("k3-quickstart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let nvme = format!("{}/", scratch.display());
    let mut ran = 0;
    for block in text.split("```sh\n").skip(1) {
        let block = &block[..block.find("```").unwrap()];
        for line in block.lines() {
            let line = line.split(" # ").next().unwrap().trim();
            if !line.starts_with("k3 ")
                || line.starts_with("k3 download")
                || line.starts_with("k3 pull")
                || line.contains("Kimi-K3")
                || line.contains("--adopt")
            {
                continue;
            }
            let line = line
                .replace("/models/kimi-k3", &tiny_arg())
                .replace("/nvme/", &nvme)
                .replace("--port 8080", "--port 0");
            let words = shell_words(&line);
            run_quickstart_command(&line, &words[1..]);
            ran += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(ran >= 8, "only {ran} commands found");
}

/// Runs one QUICKSTART command (args after `k3`) and checks it succeeded.
fn run_quickstart_command(line: &str, args: &[String]) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args(args)
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-quickstart-xdg")
        .env("XDG_RUNTIME_DIR", common::test_runtime_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if args[0] == "serve" {
        let err = BufReader::new(child.stderr.take().unwrap());
        let mut seen = Vec::new();
        for l in err.lines().map_while(Result::ok) {
            let done = l.contains("listening on http://127.0.0.1:");
            seen.push(l);
            if done {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let all = seen.join("\n");
        assert!(
            all.contains("listening on") && all.contains("memory plan"),
            "`{line}`: {all}"
        );
        return;
    }
    let mut stdin = child.stdin.take().unwrap();
    if args[0] == "chat" {
        stdin.write_all(b"Hello\n/exit\n").unwrap();
    }
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "`{line}` failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Every `$ …` example in README.md runs as printed from the repository root (through `sh`,
/// with the `k3` under test first on PATH): exit 0, or exit 2 with the printed error line
/// where the example shows `k3: error: …`.
#[test]
fn readme_examples_run_as_printed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_k3"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let lines: Vec<&str> = readme.lines().collect();
    let mut ran = 0;
    for (i, line) in lines.iter().enumerate() {
        let Some(cmd) = line.strip_prefix("$ ") else {
            continue;
        };
        let o = Command::new("sh")
            .args(["-c", cmd])
            .current_dir(&root)
            .env("PATH", &path)
            .env_remove("K3_CONFIG")
            .env("XDG_CONFIG_HOME", "/nonexistent/k3-readme-xdg")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        match lines.get(i + 1).filter(|l| l.starts_with("k3: error")) {
            Some(shown) => {
                assert_eq!(o.status.code(), Some(2), "`{cmd}`: {err}");
                assert!(err.contains(shown), "`{cmd}` prints {shown:?}: {err}");
            }
            None => assert!(o.status.success(), "`{cmd}` failed: {err}"),
        }
        ran += 1;
    }
    assert!(ran >= 10, "only {ran} examples found");
}
