//! The local model store (docs/MODELS.md): `k3 pull` from a hub imitated on 127.0.0.1, then
//! `list`, `show`, `run NAME` (the same tokens as running the directory), `rm NAME`; the
//! resolution rule (an existing directory wins, then a stored NAME, else a refusal listing the
//! stored names); and `k3 ps` listing a running server by NAME until it is gone.

mod common;
mod fake_hub;

use common::{copy_tiny, stderr, stdout, tiny_arg};
use fake_hub::{start, Hub, REPO, TOKEN};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

/// A scratch directory with `models/` (K3_MODELS), `run/` (XDG_RUNTIME_DIR) and `cwd/`.
struct Env {
    root: PathBuf,
    endpoint: String,
}

impl Env {
    fn new(tag: &str, endpoint: String) -> Env {
        let root = std::env::temp_dir().join(format!("k3-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["models", "run", "cwd"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        Env { root, endpoint }
    }
    fn models(&self) -> PathBuf {
        self.root.join("models")
    }
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_k3"));
        c.args(args)
            .current_dir(self.root.join("cwd"))
            .env("K3_MODELS", self.models())
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env("HF_ENDPOINT", &self.endpoint)
            .env("HF_TOKEN", TOKEN)
            .env("HF_HOME", self.root.join("no-hf-home"))
            .env_remove("K3_CONFIG")
            .env("XDG_CONFIG_HOME", self.root.join("no-config"));
        c
    }
    fn k3(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn ok(o: &Output) {
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(o), stderr(o));
}

#[test]
fn pull_list_show_run_rm() {
    let env = Env::new("pull", start(Arc::new(Hub::default())));
    let pulled = env.k3(&["pull", REPO]);
    ok(&pulled);
    let dir = env.models().join("tiny-k3");
    assert!(dir.join("config.json").is_file());
    assert!(
        dir.join("trunk/trunk.json").is_file(),
        "the trunk is packed"
    );
    for e in std::fs::read_dir(common::tiny()).unwrap() {
        let name = e.unwrap().file_name();
        let want = std::fs::read(common::tiny().join(&name)).unwrap();
        assert!(std::fs::read(dir.join(&name)).unwrap() == want, "{name:?}");
    }
    assert!(
        stdout(&pulled).contains(": OK"),
        "k3 verify ran: {}",
        stdout(&pulled)
    );

    let list = env.k3(&["list"]);
    ok(&list);
    let line = stdout(&list)
        .lines()
        .find(|l| l.starts_with("tiny-k3 "))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{}", stdout(&list)));
    assert!(line.contains(REPO) && line.contains("packed"), "{line}");

    let show = env.k3(&["show", "tiny-k3"]);
    ok(&show);
    let text = stdout(&show);
    assert!(
        text.contains(&format!("path        {}", dir.display())),
        "{text}"
    );
    assert!(text.contains(REPO) && text.contains("layers="), "{text}");
    assert!(
        text.contains(&format!("--trunk {}", dir.join("trunk").display())),
        "{text}"
    );

    // `run NAME` is `run DIR`: the same tokens, resident and through the stored packed trunk.
    let by_dir = env.k3(&["run", &tiny_arg(), "--ids", "1,2,3", "-n", "8"]);
    ok(&by_dir);
    let by_name = env.k3(&["run", "tiny-k3", "--ids", "1,2,3", "-n", "8"]);
    ok(&by_name);
    assert_eq!(stdout(&by_name), stdout(&by_dir));
    assert!(!stdout(&by_dir).trim().is_empty());
    let trunk = dir.join("trunk");
    let packed = env.k3(&[
        "run",
        "tiny-k3",
        "--ids",
        "1,2,3",
        "-n",
        "8",
        "--mem-gb",
        "0.005",
        "--trunk",
        trunk.to_str().unwrap(),
    ]);
    ok(&packed);
    assert_eq!(stdout(&packed), stdout(&by_dir));
    // Streaming `run NAME` reads NAME/trunk by itself: same tokens, and it really reads the pack
    // (a flipped byte in trunk.bin fails the run), while a pack that does not match is skipped
    // with a note.
    let auto = env.k3(&[
        "run", "tiny-k3", "--ids", "1,2,3", "-n", "8", "--mem-gb", "0.005",
    ]);
    ok(&auto);
    assert_eq!(stdout(&auto), stdout(&by_dir));
    assert!(
        stderr(&auto).contains("reading the trunk from the packed trunk"),
        "{}",
        stderr(&auto)
    );
    let bin = trunk.join("trunk.bin");
    let original = std::fs::read(&bin).unwrap();
    let mut flipped = original.clone();
    flipped[0] ^= 0x40;
    std::fs::write(&bin, &flipped).unwrap();
    let bad = env.k3(&[
        "run", "tiny-k3", "--ids", "1,2,3", "-n", "8", "--mem-gb", "0.005",
    ]);
    assert_ne!(bad.status.code(), Some(0), "{}", stderr(&bad));
    std::fs::write(&bin, &original).unwrap();
    let json = trunk.join("trunk.json");
    std::fs::write(&json, "{}").unwrap();
    let skipped = env.k3(&[
        "run", "tiny-k3", "--ids", "1,2,3", "-n", "8", "--mem-gb", "0.005",
    ]);
    ok(&skipped);
    assert_eq!(stdout(&skipped), stdout(&by_dir));
    assert!(
        stderr(&skipped).contains("not using the packed trunk"),
        "{}",
        stderr(&skipped)
    );

    let rm = env.k3(&["rm", "tiny-k3"]);
    ok(&rm);
    assert!(!dir.exists());
    assert!(!stdout(&env.k3(&["list"])).contains("tiny-k3"));
    let gone = env.k3(&["run", "tiny-k3", "--ids", "1", "-n", "1"]);
    assert_eq!(gone.status.code(), Some(2));
    assert!(stderr(&gone).contains("k3 pull"), "{}", stderr(&gone));
}

#[test]
fn a_directory_wins_then_a_stored_name_else_a_refusal_listing_names() {
    let env = Env::new("resolve", String::from("http://127.0.0.1:9"));
    for d in [
        env.models().join("m"),
        env.root.join("cwd/m"),
        env.models().join("other"),
    ] {
        std::fs::create_dir_all(&d).unwrap();
        copy_tiny(&d);
    }
    // `m` is both a directory here and a stored name: the directory wins.
    let o = env.k3(&["show", "m"]);
    ok(&o);
    assert!(stdout(&o).contains("path        m\n"), "{}", stdout(&o));
    // `other` is only stored.
    let o = env.k3(&["show", "other"]);
    ok(&o);
    let stored = env.models().join("other");
    assert!(stdout(&o).contains(&format!("path        {}", stored.display())));
    // Every command taking a model directory takes the name (plan, verify, tokenize, presets).
    for args in [
        &["plan", "other", "--mem-gb", "0.005"][..],
        &["verify", "other"],
        &["tokenize", "other", "--decode", "341,464"],
        &["presets", "other"],
    ] {
        ok(&env.k3(args));
    }
    // Neither: exit 2 naming the argument, the stored names and `k3 pull`.
    let o = env.k3(&["run", "nosuch", "--ids", "1", "-n", "1"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("nosuch") && err.contains("m, other") && err.contains("k3 pull"),
        "{err}"
    );
    // `rm` takes only stored names: never a path, never an unknown name.
    let cwd_m = env.root.join("cwd/m");
    for arg in [cwd_m.to_str().unwrap(), "nosuch", "."] {
        let o = env.k3(&["rm", arg]);
        assert_eq!(o.status.code(), Some(2), "{arg}");
        assert!(stderr(&o).contains("not a stored model"), "{}", stderr(&o));
    }
    assert!(cwd_m.join("config.json").is_file());
}

#[test]
fn pull_refuses_a_name_taken_by_another_repository() {
    let env = Env::new("taken", start(Arc::new(Hub::default())));
    ok(&env.k3(&["pull", REPO, "--no-pack"]));
    let dir = env.models().join("tiny-k3");
    assert!(!dir.join("trunk").exists(), "--no-pack packs nothing");
    let rec = std::fs::read_to_string(dir.join("k3-model.json")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(&rec).unwrap();
    assert_eq!(rec["repo"], REPO);
    assert_eq!(rec["packed_trunk"], false);
    let o = env.k3(&["pull", "someone-else/tiny-k3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("k3 rm tiny-k3") && stderr(&o).contains(REPO),
        "{}",
        stderr(&o)
    );
    let o = env.k3(&["pull", REPO, "--name", "../escape"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!env.root.join("escape").exists());
}

/// A running `k3 serve`, killed when dropped (also when an assertion fails).
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `k3 serve NAME --port 0`; returns the server and its port.
fn serve(env: &Env, name: &str) -> (Served, u16) {
    let child = env
        .command(&["serve", name, "--port", "0", "--threads", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Served(child);
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    while let Some(Ok(line)) = lines.next() {
        if let Some(addr) = line.split("listening on http://").nth(1) {
            let port = addr.trim().rsplit(':').next().unwrap().parse().unwrap();
            // Keep reading its stderr, so that a later line never meets a closed pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return (child, port);
        }
    }
    panic!("k3 serve exited without listening");
}

fn record_files(run: &Path) -> usize {
    std::fs::read_dir(run.join("k3/servers")).map_or(0, |rd| rd.count())
}

/// An environment (no hub) whose store holds the tiny model as `tiny`; its directory.
fn env_with_tiny(tag: &str) -> (Env, PathBuf) {
    let env = Env::new(tag, String::from("http://127.0.0.1:9"));
    let dir = env.models().join("tiny");
    std::fs::create_dir_all(&dir).unwrap();
    copy_tiny(&dir);
    (env, dir)
}

#[test]
fn ps_lists_a_running_server_by_name_until_it_is_gone() {
    let (env, dir) = env_with_tiny("ps");
    let (mut child, port) = serve(&env, "tiny");
    let o = env.k3(&["ps"]);
    ok(&o);
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with(&child.0.id().to_string()))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{}", stdout(&o)));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1], port.to_string(), "{line}");
    assert_eq!(cols[2], "tiny", "{line}");
    assert!(line.contains("resident"), "{line}");
    // RSS is the live process's, read from /proc.
    assert!(cols[3] != "?", "{line}");
    // A held model is not removed without --force.
    let o = env.k3(&["rm", "tiny"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("pid {}", child.0.id())),
        "{}",
        stderr(&o)
    );
    assert!(dir.is_dir());
    // Killed (no chance to clean up): the next `k3 ps` prunes the stale record.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert_eq!(record_files(&env.root.join("run")), 1);
    let o = env.k3(&["ps"]);
    ok(&o);
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
    assert_eq!(record_files(&env.root.join("run")), 0);
    ok(&env.k3(&["rm", "tiny"]));
}

#[test]
fn a_signalled_server_exits_0_and_removes_its_ps_record() {
    let (env, _dir) = env_with_tiny("ps-signal");
    let run = env.root.join("run");
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let (mut child, _port) = serve(&env, "tiny");
        assert_eq!(record_files(&run), 1);
        let pid = i32::try_from(child.0.id()).unwrap();
        // SAFETY: `pid` is our own child, still unreaped; kill has no other precondition.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let status = child.0.wait().unwrap();
        assert_eq!(status.code(), Some(0), "signal {signal}: {status:?}");
        assert_eq!(record_files(&run), 0, "signal {signal}");
    }
}
