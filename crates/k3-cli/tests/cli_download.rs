//! `k3 download` against a hub imitated in the test process on 127.0.0.1 (HF_ENDPOINT), serving
//! the tiny checkpoint with the hub's tree API (sizes, git blob ids, LFS SHA-256) and `resolve`
//! URLs with Range support. No network: an interrupted transfer is resumed with a Range request,
//! a file corrupted in transfer or on disk is detected and fetched again, a `.part` file left by
//! an earlier run is resumed, the token is sent, and a repository too big for the disk is
//! refused (exit 2) before anything is fetched.

use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

const REPO: &str = "test-org/tiny-k3";
const TOKEN: &str = "hf_test_token";
const SHARD1: &str = "model-00001-of-00002.safetensors";
const SHARD2: &str = "model-00002-of-00002.safetensors";

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How the fake hub misbehaves; every request is logged as (path, Range header).
#[derive(Default)]
struct Hub {
    /// Files whose first transfer stops halfway (the connection is closed).
    cut_once: Mutex<HashSet<String>>,
    /// Files whose first transfer has one byte flipped.
    corrupt_once: Mutex<HashSet<String>>,
    /// A size to list instead of the real one, for every file.
    fake_size: Option<u64>,
    log: Mutex<Vec<(String, Option<String>)>>,
}

impl Hub {
    fn tree(&self) -> String {
        let mut entries = Vec::new();
        let mut names: Vec<String> = std::fs::read_dir(tiny())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let bytes = std::fs::read(tiny().join(&name)).unwrap();
            let size = self.fake_size.unwrap_or(bytes.len() as u64);
            let mut git = Sha1::new();
            git.update(format!("blob {}\0", bytes.len()).as_bytes());
            git.update(&bytes);
            let mut e = serde_json::json!({
                "type": "file", "path": name, "size": size, "oid": hex(&git.finalize()),
            });
            if name.ends_with(".safetensors") || name == "tiktoken.model" {
                let sha = hex(&Sha256::digest(&bytes));
                e["lfs"] = serde_json::json!({"oid": sha, "size": size, "pointerSize": 134});
            }
            entries.push(e);
        }
        entries.push(serde_json::json!({"type": "directory", "path": "extras", "oid": "0"}));
        serde_json::to_string(&entries).unwrap()
    }

    fn serve(&self, mut s: TcpStream) {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let (mut range, mut auth) = (None, None);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap() == 0 || h.trim().is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            match k.to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => auth = Some(v.trim().to_string()),
                _ => {}
            }
        }
        self.log.lock().unwrap().push((path.clone(), range.clone()));
        if auth.as_deref() != Some(&format!("Bearer {TOKEN}")) {
            return reply(&mut s, "401 Unauthorized", &[], b"no token");
        }
        if path == format!("/api/models/{REPO}/tree/main?recursive=true") {
            return reply(&mut s, "200 OK", &[], self.tree().as_bytes());
        }
        let Some(name) = path.strip_prefix(&format!("/{REPO}/resolve/main/")) else {
            return reply(&mut s, "404 Not Found", &[], b"");
        };
        let Ok(mut bytes) = std::fs::read(tiny().join(name)) else {
            return reply(&mut s, "404 Not Found", &[], b"");
        };
        if self.corrupt_once.lock().unwrap().remove(name) {
            let at = bytes.len() / 3;
            bytes[at] ^= 1;
        }
        let from: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
            .unwrap_or(0);
        let body = &bytes[from..];
        let cr = format!(
            "Content-Range: bytes {from}-{}/{}",
            bytes.len() - 1,
            bytes.len()
        );
        let (status, extra) = match from {
            0 => ("200 OK", vec![]),
            _ => ("206 Partial Content", vec![cr]),
        };
        if self.cut_once.lock().unwrap().remove(name) {
            // Promise the whole body, send half of it, hang up.
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&body[..body.len() / 2]);
            let _ = s.flush();
            return;
        }
        reply(&mut s, status, &extra, body);
    }
}

fn reply(s: &mut TcpStream, status: &str, headers: &[String], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
}

/// Starts the hub on a free port; returns its endpoint.
fn start(hub: Arc<Hub>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let hub = hub.clone();
            std::thread::spawn(move || hub.serve(s));
        }
    });
    format!("http://{addr}")
}

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
