//! `k3 download` against a hub imitated in the test process on 127.0.0.1 (HF_ENDPOINT), serving
//! the tiny checkpoint with the hub's tree API (sizes, git blob ids, LFS SHA-256) and `resolve`
//! URLs with Range support. No network: an interrupted transfer is resumed with a Range request,
//! a file corrupted in transfer or on disk is detected and fetched again, a `.part` file left by
//! an earlier run is resumed, the token is sent, and a repository too big for the disk is
//! refused (exit 2) before anything is fetched. Also the smaller first-hour items: the usage line,
//! a refused connection naming its URL once, a stalled hub given up after `K3_HUB_TIMEOUT`.

mod fake_hub;

use fake_hub::{start, tiny, Hub, REPO, SHARD1, SHARD2, TOKEN};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("k3-download-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn download(endpoint: &str, dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["download", REPO])
        .arg(dir)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_TOKEN", TOKEN)
        .env("HF_HOME", dir.join("no-hf-home"))
        .output()
        .unwrap()
}

fn assert_same_as_tiny(dir: &Path) {
    for e in std::fs::read_dir(tiny()).unwrap() {
        let name = e.unwrap().file_name();
        let want = std::fs::read(tiny().join(&name)).unwrap();
        assert!(
            std::fs::read(dir.join(&name)).unwrap() == want,
            "{name:?} differs"
        );
        let mut part = name.clone();
        part.push(".part");
        assert!(!dir.join(part).exists());
    }
}

fn requests(hub: &Hub, name: &str) -> Vec<Option<String>> {
    let log = hub.log.lock().unwrap();
    log.iter()
        .filter(|(p, _)| p.ends_with(&format!("/resolve/main/{name}")))
        .map(|(_, r)| r.clone())
        .collect()
}

#[test]
fn interrupted_and_corrupted_transfers_are_resumed_and_fetched_again() {
    let hub = Arc::new(Hub::default());
    hub.cut_once.lock().unwrap().insert(SHARD1.into());
    hub.corrupt_once.lock().unwrap().insert(SHARD2.into());
    let endpoint = start(hub.clone());
    let dir = scratch("transfer");
    let out = download(&endpoint, &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_same_as_tiny(&dir);
    // The cut transfer was resumed where it stopped, with a Range request.
    let half = std::fs::metadata(tiny().join(SHARD1)).unwrap().len() / 2;
    assert_eq!(
        requests(&hub, SHARD1),
        [None, Some(format!("bytes={half}-"))]
    );
    assert!(
        err.contains(&format!("{SHARD1}: resuming at byte {half}")),
        "{err}"
    );
    // The corrupted one was fetched again, whole.
    assert_eq!(requests(&hub, SHARD2), [None, None]);
    assert!(err.contains(&format!("{SHARD2}: hash ")), "{err}");
    // It ends with k3 verify's report on stdout.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("k3 verify") && stdout.trim_end().ends_with(": OK"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_earlier_part_file_is_resumed_and_a_damaged_file_replaced() {
    let hub = Arc::new(Hub::default());
    let endpoint = start(hub.clone());
    let dir = scratch("resume");
    std::fs::create_dir_all(&dir).unwrap();
    let shard = std::fs::read(tiny().join(SHARD2)).unwrap();
    std::fs::write(dir.join(format!("{SHARD2}.part")), &shard[..1000]).unwrap();
    let mut config = std::fs::read(tiny().join("config.json")).unwrap();
    config[10] ^= 0x20; // same length, wrong bytes: only the hash can tell
    std::fs::write(dir.join("config.json"), &config).unwrap();
    let out = download(&endpoint, &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_same_as_tiny(&dir);
    assert_eq!(requests(&hub, SHARD2), [Some("bytes=1000-".to_string())]);
    assert_eq!(requests(&hub, "config.json"), [None]);
    assert!(
        err.contains("config.json: on disk but its hash is wrong"),
        "{err}"
    );

    // A second run finds everything complete and fetches nothing.
    hub.log.lock().unwrap().clear();
    let again = download(&endpoint, &dir);
    assert!(again.status.success());
    let log = hub.log.lock().unwrap();
    assert!(log.iter().all(|(p, _)| p.starts_with("/api/")), "{log:?}");
    drop(log);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_repository_bigger_than_the_disk_is_refused_before_fetching() {
    let hub = Arc::new(Hub {
        fake_size: Some(1 << 58),
        ..Hub::default()
    });
    let endpoint = start(hub.clone());
    let dir = scratch("disk");
    let out = download(&endpoint, &dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GB free but") && err.contains("still to fetch"),
        "{err}"
    );
    assert!(hub
        .log
        .lock()
        .unwrap()
        .iter()
        .all(|(p, _)| p.starts_with("/api/")));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_token_is_a_refusal_naming_hf_token() {
    let hub = Arc::new(Hub::default());
    let endpoint = start(hub);
    let dir = scratch("token");
    let out = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["download", REPO])
        .arg(&dir)
        .env("HF_ENDPOINT", &endpoint)
        .env_remove("HF_TOKEN")
        .env("HF_HOME", dir.join("no-hf-home"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HF_TOKEN"));
}

#[test]
fn the_usage_line_reads_repo_then_dir() {
    let out = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["download", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(
        help.contains("Usage: k3 download [OPTIONS] [REPO] <DIR>"),
        "{help}"
    );
    assert!(!help.contains("REPO] [DIR>"), "{help}");
}

#[test]
fn a_refused_connection_names_the_url_once() {
    // A port that was just free: nothing listens there any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let dir = scratch("refused");
    let out = download(&endpoint, &dir);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.starts_with("k3: error:")).unwrap();
    let url = format!("{endpoint}/api/models/{REPO}/tree/main?recursive=true");
    assert_eq!(line.matches(&url).count(), 1, "{line}");
    assert!(line.to_lowercase().contains("refused"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stalled_hub_is_given_up_after_k3_hub_timeout_naming_it() {
    let hub = Arc::new(Hub {
        stall: true,
        ..Hub::default()
    });
    let endpoint = start(hub);
    let dir = scratch("stall");
    let t0 = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["download", REPO])
        .arg(&dir)
        .env("HF_ENDPOINT", &endpoint)
        .env("HF_TOKEN", TOKEN)
        .env("K3_HUB_TIMEOUT", "1")
        .output()
        .unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no answer for 1 s") && err.contains("K3_HUB_TIMEOUT"),
        "{err}"
    );
    // Given up after the 1 s limit, not the old 120 s (generous bound for a busy machine).
    assert!(secs < 30.0, "{secs} s");
    let _ = std::fs::remove_dir_all(&dir);
}
