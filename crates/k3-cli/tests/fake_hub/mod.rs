//! A Hugging Face hub imitated on 127.0.0.1 for the `k3 download` / `k3 pull` tests: the
//! tree API (sizes, git blob ids, LFS SHA-256 computed here from the files, as the hub
//! publishes them) and `resolve` URLs with Range support, serving the tiny checkpoint.
#![allow(dead_code)]

use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub const REPO: &str = "test-org/tiny-k3";
pub const TOKEN: &str = "hf_test_token";
pub const SHARD1: &str = "model-00001-of-00002.safetensors";
pub const SHARD2: &str = "model-00002-of-00002.safetensors";

pub fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How the fake hub misbehaves; every request is logged as (path, Range header).
#[derive(Default)]
pub struct Hub {
    /// Answer nothing (hold every connection open without a byte): a stalled hub.
    pub stall: bool,
    /// Files whose first transfer stops halfway (the connection is closed).
    pub cut_once: Mutex<HashSet<String>>,
    /// Files whose first transfer has one byte flipped.
    pub corrupt_once: Mutex<HashSet<String>>,
    /// A size to list instead of the real one, for every file.
    pub fake_size: Option<u64>,
    pub log: Mutex<Vec<(String, Option<String>)>>,
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
        if self.stall {
            std::thread::sleep(std::time::Duration::from_secs(60));
            return;
        }
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

pub fn reply(s: &mut TcpStream, status: &str, headers: &[String], body: &[u8]) {
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
pub fn start(hub: Arc<Hub>) -> String {
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
