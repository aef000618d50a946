//! Packed trunks (`k3 pack` + `run --trunk`), `tokenizer.json` imports and the config file
//! (`$XDG_CONFIG_HOME/k3/config.toml`, `~/.config/k3/config.toml`): damaged copies are refused
//! with the documented exit code and a message naming the file (and key, layer or line).

use crate::common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// `k3 pack {dir} {dir}/pack`, then `edit` on the pack directory.
fn packed(edit: impl Fn(&Path) + 'static) -> impl Fn(&Path) + 'static {
    pack_then(&[], "pack", edit)
}

fn flip_byte(p: &Path, at: usize) {
    let mut b = std::fs::read(p).unwrap();
    b[at] ^= 0xff;
    std::fs::write(p, b).unwrap();
}

fn run_trunk(mem_gb: &str) -> Vec<String> {
    args(&[
        "run",
        "{dir}",
        "--trunk",
        "{dir}/pack",
        "--mem-gb",
        mem_gb,
        "--ids",
        PROMPT,
        "-n",
        "4",
    ])
}

#[test]
fn damaged_trunk_packs_are_refused() {
    let tj = "trunk.json";
    check_all(
        "trunk-pack",
        vec![
            case(
                "bin-truncated",
                "trunk.bin cut to 600000 bytes",
                packed(|p| truncate_to(&p.join("trunk.bin"), 600_000)),
                run_trunk("0.003"),
                2,
                &["trunk.bin", "layer 6", "bytes missing", "k3 pack"],
            ),
            case(
                "bin-missing",
                "trunk.bin deleted",
                packed(|p| {
                    std::fs::remove_file(p.join("trunk.bin")).unwrap();
                }),
                run_trunk("0.003"),
                2,
                &["trunk.bin", "No such file"],
            ),
            case(
                "checksum-pinned",
                "one byte of layer 3 flipped in trunk.bin, every layer pinned (--mem-gb 1)",
                packed(|p| flip_byte(&p.join("trunk.bin"), 300_000)),
                run_trunk("1"),
                2,
                &[
                    "trunk.bin",
                    "layer 3",
                    "has checksum",
                    "trunk.json records",
                    "k3 pack",
                ],
            ),
            case(
                "checksum-streamed",
                "one byte of layer 3 flipped in trunk.bin, layers streamed (--mem-gb 0.003)",
                packed(|p| flip_byte(&p.join("trunk.bin"), 300_000)),
                run_trunk("0.003"),
                1,
                &["trunk.bin", "layer 3", "has checksum", "k3 pack"],
            ),
            case(
                "json-overlapping-offsets",
                "trunk.json: layer 2's file_off moved 4096 bytes up",
                packed(move |p| {
                    edit_json(&p.join(tj), |v| {
                        let off = v["layers"][2]["file_off"].as_u64().unwrap();
                        v["layers"][2]["file_off"] = Value::from(off + 4096);
                    })
                }),
                run_trunk("0.003"),
                2,
                &["trunk.json", "layers 2", "overlap"],
            ),
            case(
                "json-tensor-outside-run",
                "trunk.json: a layer-1 tensor's off set to 999999999",
                packed(move |p| {
                    edit_json(&p.join(tj), |v| {
                        let t = v["layers"][1]["tensors"].as_object_mut().unwrap();
                        let first = t.keys().next().unwrap().clone();
                        t[&first]["off"] = Value::from(999_999_999u64);
                    })
                }),
                run_trunk("0.003"),
                2,
                &["trunk.json", "layer 1", "outside"],
            ),
            case(
                "json-layer-missing",
                "trunk.json: the last layer entry removed (12 of 13)",
                packed(move |p| {
                    edit_json(&p.join(tj), |v| {
                        v["layers"].as_array_mut().unwrap().pop();
                    })
                }),
                run_trunk("0.003"),
                2,
                &["trunk.json", "lists 12 layers", "13"],
            ),
            case(
                "json-not-json",
                "trunk.json is not JSON",
                packed(move |p| {
                    std::fs::write(p.join(tj), "not json {").unwrap();
                }),
                run_trunk("0.003"),
                2,
                &["trunk.json", "not a k3 trunk pack index", "k3 pack"],
            ),
        ],
    );
}

/// `k3 tokenize {dir} --export {dir}/tj/tokenizer.json`, then `edit` on the JSON text.
fn exported(edit: impl Fn(String) -> String + 'static) -> impl Fn(&Path) + 'static {
    move |d: &Path| {
        let dir = d.join("tj");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("tokenizer.json");
        let o = k3(&args(&[
            "tokenize",
            &d.display().to_string(),
            "--export",
            &out.display().to_string(),
        ]));
        assert!(
            o.status.success(),
            "export: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let text = std::fs::read_to_string(&out).unwrap();
        std::fs::write(&out, edit(text)).unwrap();
    }
}

fn json_edit(f: impl Fn(&mut Value) + 'static) -> impl Fn(String) -> String + 'static {
    move |t: String| {
        let mut v: Value = serde_json::from_str(&t).unwrap();
        f(&mut v);
        v.to_string()
    }
}

#[test]
fn damaged_tokenizer_json_imports_are_refused() {
    let tok = args(&["tokenize", "{dir}/tj", "--text", "The train"]);
    check_all(
        "tokenizer-json",
        vec![
            case(
                "not-json",
                "tokenizer.json is not JSON",
                exported(|_| "{not json".into()),
                tok.clone(),
                2,
                &["tj/tokenizer.json:1:2", "unreadable JSON"],
            ),
            case(
                "truncated",
                "tokenizer.json cut in half",
                exported(|t| t[..t.len() / 2].to_string()),
                tok.clone(),
                2,
                &["tj/tokenizer.json:", "EOF while parsing"],
            ),
            case(
                "model-not-bpe",
                "model.type WordPiece",
                exported(json_edit(|v| v["model"]["type"] = Value::from("WordPiece"))),
                tok.clone(),
                2,
                &["tj/tokenizer.json", "reading tokenizer.json"],
            ),
            case(
                "repeated-vocab-id",
                "two vocab strings share id 5 (was silently accepted)",
                exported(json_edit(|v| {
                    let vocab = v["model"]["vocab"].as_object_mut().unwrap();
                    let k = vocab
                        .iter()
                        .find(|(_, id)| id.as_u64() == Some(300))
                        .unwrap()
                        .0
                        .clone();
                    vocab.insert(k, Value::from(5));
                })),
                tok.clone(),
                2,
                &[
                    "tj/tokenizer.json",
                    "vocab id 5 is given to more than one token",
                ],
            ),
            case(
                "bad-merge",
                "a merge of two unknown tokens",
                exported(json_edit(|v| {
                    v["model"]["merges"]
                        .as_array_mut()
                        .unwrap()
                        .push(Value::from("zzzq qqqz"));
                })),
                tok.clone(),
                2,
                &["tj/tokenizer.json", "MergeType"],
            ),
            case(
                "other-pre-tokenizer",
                "pre_tokenizer pattern replaced",
                exported(json_edit(|v| {
                    v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
                        Value::from("\\w+");
                })),
                tok,
                2,
                &[
                    "tj/tokenizer.json",
                    "unsupported tokenizer.json",
                    "pre-tokenizer",
                ],
            ),
        ],
    );
}

/// Runs `k3 run` on the tiny model with a config file at `$XDG_CONFIG_HOME/k3/config.toml`
/// (or `$HOME/.config/k3/config.toml` when `home`), returning (exit code, stderr).
fn with_config(name: &str, body: &str, home: bool) -> (i32, String, String) {
    let s = Scratch::empty(&format!("cfgfile-{name}"));
    let rel = if home { ".config/k3" } else { "k3" };
    let file = s.path().join(rel).join("config.toml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, body).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args([
        "run",
        &tiny().display().to_string(),
        "--ids",
        PROMPT,
        "-n",
        "1",
    ])
    .env_remove("RUST_BACKTRACE")
    .env_remove("K3_CONFIG");
    if home {
        cmd.env_remove("XDG_CONFIG_HOME").env("HOME", s.path());
    } else {
        cmd.env("XDG_CONFIG_HOME", s.path());
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (
        o.status.code().unwrap_or(-1),
        err,
        file.display().to_string(),
    )
}

#[test]
fn broken_config_files_are_refused() {
    let cases: &[(&str, &str, &str, bool, &[&str])] = &[
        (
            "bad-toml",
            "config.toml with `mem_gb = [1` (unclosed array)",
            "mem_gb = [1\n",
            false,
            &["line 1, column 13"],
        ),
        (
            "unknown-key",
            "config.toml with the unknown key `memgb`",
            "memgb = 4\n",
            false,
            &["unknown field `memgb`", "mem_gb"],
        ),
        (
            "wrong-type",
            "config.toml with `threads = \"eight\"`",
            "threads = \"eight\"\n",
            false,
            &["invalid type: string \"eight\"", "threads"],
        ),
        (
            "bad-value",
            "config.toml with `temp = -1`",
            "temp = -1\n",
            false,
            &["key `temp`", "must be >= 0"],
        ),
        (
            "home-fallback",
            "~/.config/k3/config.toml (no XDG_CONFIG_HOME) with `x =`",
            "x =\n",
            true,
            &["TOML parse error"],
        ),
    ];
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for (name, input, body, home, needles) in cases {
        let (code, err, file) = with_config(name, body, *home);
        let panicked = err.contains("panicked") || err.contains("RUST_BACKTRACE");
        let missing: Vec<_> = needles
            .iter()
            .chain([&"config.toml"])
            .filter(|n| !err.contains(*n))
            .collect();
        if code != 2 || panicked || !missing.is_empty() || !err.contains(&file) {
            failures.push(format!(
                "[config-file/{name}] code {code}, missing {missing:?} or the path {file}: {err}"
            ));
        }
        let first = err.lines().next().unwrap_or("").replace(&file, "CONFIG");
        rows.push(format!(
            "| config-file | {name} | {input} | {code} | `{}` |",
            first.replace('|', "\\|")
        ));
    }
    if let Some(d) = std::env::var_os("K3_HOSTILE_CATALOGUE") {
        let _ = std::fs::create_dir_all(&d);
        let _ = std::fs::write(Path::new(&d).join("config-file.md"), rows.join("\n") + "\n");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
