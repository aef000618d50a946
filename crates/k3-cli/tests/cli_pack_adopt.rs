//! `k3 pack MODEL --adopt DIR` (docs/FORMATS.md#adopting-an-upstream-pack) on a pack in
//! upstream's format, written by the small independent writer shared with k3-format's tests
//! (from the format's description, never from k3's pack): `run --trunk` refuses it pointing at
//! `--adopt`; adopting it writes k3's index without touching `trunk.bin`; runs streaming from
//! it give ids and logits bit-identical to runs without it; a damaged layer is refused by
//! number and nothing is adopted.

mod common;
use k3_testkit::upstream_pack;

use common::{k3, scratch_dir, stderr, tiny_arg};
use std::path::Path;
use upstream_pack::{flip_bin_byte, write_upstream_pack, Style};

const PROMPT: &str = "637,229,263,638,730,42,197";

/// `k3 run` on the tiny model with `flags`; returns the generated-ids line, the logits dump
/// and the JSON report.
fn run(dir: &Path, tag: &str, flags: &[&str]) -> (String, Vec<u8>, serde_json::Value) {
    let logits = dir.join(format!("{tag}.logits"));
    let json = dir.join(format!("{tag}.json"));
    let mut a = vec![
        "run".to_string(),
        tiny_arg(),
        "--ids".into(),
        PROMPT.into(),
        "-n".into(),
        "8".into(),
        "--print-ids".into(),
        "--dump-logits".into(),
        logits.to_string_lossy().into_owned(),
        "--json".into(),
        json.to_string_lossy().into_owned(),
    ];
    a.extend(flags.iter().map(|s| s.to_string()));
    let o = k3(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{tag}: {}", stderr(&o));
    let ids = stderr(&o)
        .lines()
        .find(|l| l.starts_with("generated ids: "))
        .unwrap_or_else(|| panic!("{tag}: {}", stderr(&o)))
        .to_string();
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (ids, std::fs::read(&logits).unwrap(), report)
}

#[test]
fn an_upstream_pack_is_adopted_and_streams_bit_identically() {
    let dir = scratch_dir("adopt", "ok");
    let pack = dir.join("upstream");
    write_upstream_pack(Path::new(&tiny_arg()), &pack, Style::default());
    let upstream_json = std::fs::read_to_string(pack.join("trunk.json")).unwrap();
    let bin_before = std::fs::read(pack.join("trunk.bin")).unwrap();
    let p = pack.to_string_lossy().into_owned();

    let refused = k3(&[
        "run",
        &tiny_arg(),
        "--ids",
        "1",
        "-n",
        "1",
        "--mem-gb",
        "0.003",
        "--trunk",
        &p,
    ]);
    assert_eq!(refused.status.code(), Some(2));
    let err = stderr(&refused);
    assert!(
        err.contains("no \"checksum\"") && err.contains("--adopt"),
        "{err}"
    );

    let out = k3(&["pack", &tiny_arg(), "--adopt", &p]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("adopted") && err.contains("13 layers"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    assert_eq!(std::fs::read(pack.join("trunk.bin")).unwrap(), bin_before);
    let kept = std::fs::read_to_string(pack.join("trunk.json.upstream")).unwrap();
    assert_eq!(kept, upstream_json);

    // The whole model resident is the reference; then streamed (--mem-gb 0.003 pins no layer)
    // and pinned, each from the shards and from the adopted pack.
    let (ids, logits, _) = run(&dir, "resident", &[]);
    assert_eq!(logits.len(), 1024 * 4, "vocab_size f32 values");
    for (mode, mem) in [("streamed", "0.003"), ("pinned", "1")] {
        let (ids_s, logits_s, report) = run(&dir, &format!("{mode}-shards"), &["--mem-gb", mem]);
        let with = ["--mem-gb", mem, "--trunk", p.as_str()];
        let (ids_p, logits_p, report_p) = run(&dir, &format!("{mode}-pack"), &with);
        assert_eq!(ids_s, ids, "{mode} from the shards");
        assert_eq!(ids_p, ids, "{mode} from the pack");
        assert!(logits_s == logits, "{mode} from the shards: logits differ");
        assert!(logits_p == logits, "{mode} from the pack: logits differ");
        if mode == "streamed" {
            assert_eq!(report_p["plan"]["trunk_pinned_layers"], 0, "{report_p}");
            assert!(
                report_p["bytes_read_trunk"].as_u64().unwrap() > 0,
                "{report_p}"
            );
            assert!(report["bytes_read_trunk"].as_u64().unwrap() > 0, "{report}");
        }
    }
    // The streamed run really reads trunk.bin: a flipped byte in a run is caught on load.
    flip_bin_byte(&pack, 100, 0x01);
    let o = k3(&[
        "run",
        &tiny_arg(),
        "--ids",
        "1",
        "-n",
        "1",
        "--mem-gb",
        "0.003",
        "--trunk",
        &p,
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("layer 0"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `trunk.bin` that ends at the last run's end (its padding cut off, `nbytes` still rounded
/// up) is adopted, and the last layer streams from it like the rest.
#[test]
fn a_pack_without_tail_padding_is_adopted_and_streams_bit_identically() {
    let dir = scratch_dir("adopt", "tail");
    let pack = dir.join("upstream");
    let style = Style {
        no_tail_padding: true,
        ..Style::default()
    };
    write_upstream_pack(Path::new(&tiny_arg()), &pack, style);
    let p = pack.to_string_lossy().into_owned();
    let out = k3(&["pack", &tiny_arg(), "--adopt", &p]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (ids, logits, _) = run(&dir, "resident", &[]);
    let (ids_p, logits_p, _) = run(&dir, "pack", &["--mem-gb", "0.003", "--trunk", &p]);
    assert_eq!(ids_p, ids);
    assert!(logits_p == logits, "logits differ");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_layer_is_refused_by_number_and_nothing_is_adopted() {
    let dir = scratch_dir("adopt", "bad");
    let (runs, doc) = write_upstream_pack(Path::new(&tiny_arg()), &dir, Style::default());
    let json = std::fs::read_to_string(dir.join("trunk.json")).unwrap();
    let run5 = &runs[5];
    let at = (run5.end - run5.start) / 2;
    flip_bin_byte(
        &dir,
        doc["layers"][5]["file_off"].as_u64().unwrap() + at,
        0x40,
    );

    let out = k3(&["pack", &tiny_arg(), "--adopt", &dir.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "layer 5 differs from the checkpoint at byte {at} "
        )),
        "{err}"
    );
    assert!(
        err.contains("tensor \"language_model.model.layers.5."),
        "{err}"
    );
    assert!(err.contains("nothing was adopted"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("trunk.json")).unwrap(),
        json
    );
    assert!(!dir.join("trunk.json.upstream").exists());
    assert!(!dir.join("trunk.json.tmp").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn adopt_takes_no_out_dir() {
    let out = k3(&["pack", &tiny_arg(), "/tmp/x", "--adopt", "/tmp/y"]);
    assert_eq!(out.status.code(), Some(2));
    let out = k3(&["pack", &tiny_arg()]);
    assert_eq!(out.status.code(), Some(2));
}
