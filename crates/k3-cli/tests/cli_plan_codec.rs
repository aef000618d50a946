//! `k3 plan`'s trunk compression forecast (docs/STREAMING.md#plain-or-compressed): the lines
//! and the JSON say which pack pays at the given drive rate and cores, and a model directory
//! holding both a plain and a compressed pack is run from the one the forecast names, with
//! the same ids.

mod common;
use common::{copy_tiny, k3, scratch_dir, stderr, stdout, tiny_arg as tiny};

/// The smallest budget of the tiny model: every trunk layer streams.
const SMALLEST: &str = "0.003";
const PROMPT: &str = "637,229,263,638,730,42,197";

fn plan(extra: &[&str]) -> std::process::Output {
    let t = tiny();
    let mut a = vec!["plan", t.as_str(), "--mem-gb", SMALLEST];
    a.extend_from_slice(extra);
    k3(&a)
}

#[test]
fn plan_says_whether_compression_pays() {
    let o = plan(&["--read-gbps", "0.5", "-t", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("drive 0.50 GB/s (given)"), "{out}");
    assert!(out.contains("stored ratio 0.667"), "{out}");
    assert!(out.contains("compressed trunk: "), "{out}");
    assert!(
        out.contains("compression pays at 0.50 GB/s with 2 decoding cores"),
        "{out}"
    );
    assert!(
        out.contains("make a compressed pack (`k3 pack --compress"),
        "{out}"
    );
    let o = plan(&["--read-gbps", "100", "-t", "2"]);
    let out = stdout(&o);
    assert!(
        out.contains("compression does not pay at 100.0 GB/s with 2 decoding cores"),
        "{out}"
    );
    assert!(out.contains("use a plain pack (`k3 pack "), "{out}");
    for (bad, shown) in [("0", "0"), ("-1", "-1"), ("nan", "NaN")] {
        let arg = format!("--read-gbps={bad}");
        let o = plan(&[arg.as_str()]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        let want = format!("--read-gbps must be positive, got {shown}");
        assert!(stderr(&o).contains(&want), "{bad}: {}", stderr(&o));
    }
    let o = plan(&["-t", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--threads must be at least 1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn plan_json_carries_the_forecast() {
    let o = plan(&["--json", "--read-gbps", "2", "-t", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let streamed = v["trunk"]["streamed_bytes_per_token"].as_u64().unwrap();
    assert!(streamed > 0, "{v}");
    let c = &v["trunk_codec"];
    assert_eq!(c["decoding_cores"], 2);
    assert_eq!(c["read_rate_source"], "given");
    assert_eq!(c["decoded_bytes_per_token"].as_u64(), Some(streamed));
    let stored = c["stored_bytes_per_token"].as_f64().unwrap();
    assert!((stored / streamed as f64 - 0.667).abs() < 1e-3, "{c}");
    let plain = c["plain_seconds_per_token"].as_f64().unwrap();
    assert!((plain - streamed as f64 / 2e9).abs() < 1e-12, "{c}");
    let pays = c["compressed_seconds_per_token"].as_f64().unwrap() < plain;
    assert_eq!(c["compression_pays"].as_bool(), Some(pays), "{c}");
    // Everything in memory: nothing streams, no forecast.
    let t = tiny();
    let o = k3(&["plan", t.as_str(), "--mem-gb", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert!(v["trunk_codec"].is_null(), "{v}");
}

#[test]
fn a_model_dir_with_both_packs_runs_from_the_chosen_one() {
    let dir = scratch_dir("plan-codec", "both");
    copy_tiny(&dir);
    let d = dir.to_str().unwrap();
    let plain = format!("{d}/trunk");
    let comp = format!("{d}/trunk-compressed");
    let o = k3(&["pack", d, &plain]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = k3(&["pack", "--compress", d, &comp]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = k3(&["plan", d, "--mem-gb", SMALLEST, "--read-gbps", "100"]);
    assert!(
        stdout(&o).contains(&format!("use the plain pack {plain}")),
        "{}",
        stdout(&o)
    );
    // The tiny model's tensors are all under 64 KiB, kept raw: its compressed pack stores
    // every byte (ratio 1.000), so it never pays, however slow the drive.
    let o = k3(&["plan", d, "--mem-gb", SMALLEST, "--read-gbps", "0.01"]);
    let out = stdout(&o);
    assert!(
        out.contains(&format!("stored ratio 1.000 (of {comp})")),
        "the pack's own ratio: {out}"
    );
    assert!(
        out.contains("compression does not pay at 0.01 GB/s"),
        "{out}"
    );
    assert!(
        out.contains(&format!("use the plain pack {plain}")),
        "{out}"
    );
    // The compressed pack's two staging buffers are planned with the scratch (at the
    // smallest plain budget they do not fit: the budget must hold them too).
    let scratch = |pack: &str| {
        let o = k3(&["plan", d, "--mem-gb", "0.01", "--trunk", pack, "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
        v["scratch_bytes"].as_u64().unwrap()
    };
    let extra = scratch(&comp) - scratch(&plain);
    assert!(extra >= 2 * 8192 && extra % 8192 == 0, "{extra}");
    let o = k3(&["plan", d, "--mem-gb", SMALLEST, "--trunk", &comp]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let resident = k3(&["run", d, "--ids", PROMPT, "-n", "8"]);
    assert!(resident.status.success(), "{}", stderr(&resident));
    let streamed = k3(&["run", d, "--ids", PROMPT, "-n", "8", "--mem-gb", SMALLEST]);
    assert!(streamed.status.success(), "{}", stderr(&streamed));
    assert_eq!(stdout(&streamed), stdout(&resident));
    let err = stderr(&streamed);
    assert!(
        err.contains(&format!(
            "k3: reading the trunk from {plain} (as --trunk): compression does not pay"
        )),
        "{err}"
    );
}

#[test]
fn a_chosen_compressed_pack_that_does_not_fit_gives_way_to_the_plain_one() {
    use k3_format::pack::{write_compressed_pack_with, CompressOptions, PackOptions};
    let dir = scratch_dir("plan-codec", "fallback");
    copy_tiny(&dir);
    let d = dir.to_str().unwrap();
    let plain = format!("{d}/trunk");
    let o = k3(&["pack", d, &plain]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Every BF16 tensor coded (small chunks): fewer stored bytes than the plain pack, so on
    // a slow enough drive the forecast chooses it.
    let cfg = k3_format::K3Config::load(dir.join("config.json")).unwrap();
    let ck = k3_format::Checkpoint::open(&*dir).unwrap();
    let b = k3_format::bind_model(&ck, &cfg).unwrap();
    let c = CompressOptions {
        chunk_values: 1000,
        min_coded_bytes: 0,
    };
    let comp = dir.join("trunk-compressed");
    write_compressed_pack_with(
        &ck,
        &b,
        &cfg,
        &comp,
        &PackOptions::default(),
        &c,
        &mut |_, _| {},
    )
    .unwrap();
    let o = k3(&["plan", d, "--mem-gb", SMALLEST, "--read-gbps", "0.001"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("use the compressed pack {}", comp.display())),
        "{}",
        stdout(&o)
    );
    // its coded chunks are timed for the decode rate (the raw pack above is not)
    assert!(
        stdout(&o).contains(&format!("per core (timed on {}), mat-vec", comp.display())),
        "{}",
        stdout(&o)
    );
    // its two staging buffers do not fit the plain pack's smallest budget: planned plain
    assert!(
        stderr(&o).contains(&format!("planning the trunk from {plain} instead")),
        "{}",
        stderr(&o)
    );
}
