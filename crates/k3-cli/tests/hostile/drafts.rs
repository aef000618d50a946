//! Draft trunks (`k3 pack --draft-quant` + `--draft-trunk`): damaged, mismatched or
//! misplaced copies are refused with exit 2 and a message naming the file and what to do.

use crate::common::*;
use serde_json::Value;
use std::path::Path;

/// `k3 pack --draft-quant q8 {dir} {dir}/draft`, then `edit` on the draft directory.
fn drafted(edit: impl Fn(&Path) + 'static) -> impl Fn(&Path) + 'static {
    pack_then(&["--draft-quant", "q8"], "draft", edit)
}

/// The first I8R tensor of layer 1 in the draft's index.
fn first_quantized(v: &mut Value) -> &mut Value {
    v["layers"][1]["tensors"]
        .as_object_mut()
        .unwrap()
        .values_mut()
        .find(|t| t["dtype"] == "I8R")
        .unwrap()
}

fn run_draft(dir: &str) -> Vec<String> {
    args(&[
        "run",
        "{dir}",
        "--draft",
        "hybrid",
        "--draft-trunk",
        dir,
        "--ids",
        PROMPT,
        "-n",
        "4",
    ])
}

#[test]
fn damaged_or_misplaced_draft_trunks_are_refused() {
    let json = |p: &Path| p.join("trunk.json");
    check_all(
        "draft-trunk",
        vec![
            case(
                "bin-truncated",
                "draft trunk.bin cut to 200000 bytes",
                drafted(|p| truncate_to(&p.join("trunk.bin"), 200_000)),
                run_draft("{dir}/draft"),
                2,
                &["draft/trunk.bin", "bytes missing"],
            ),
            case(
                "checksum",
                "one byte of the draft's trunk.bin flipped",
                drafted(|p| {
                    let bin = p.join("trunk.bin");
                    let mut b = std::fs::read(&bin).unwrap();
                    b[150_000] ^= 0xff;
                    std::fs::write(bin, b).unwrap();
                }),
                run_draft("{dir}/draft"),
                2,
                &["draft/trunk.bin", "has checksum", "trunk.json records"],
            ),
            case(
                "unknown-quant",
                "trunk.json: \"draft\": \"q3\"",
                drafted(move |p| edit_json(&json(p), |v| v["draft"] = Value::from("q3"))),
                run_draft("{dir}/draft"),
                2,
                &["draft/trunk.json", "\"draft\" is \"q3\"", "q8", "mxfp4"],
            ),
            case(
                "quantized-size",
                "trunk.json: an I8R tensor's nbytes one short",
                drafted(move |p| {
                    edit_json(&json(p), |v| {
                        let t = first_quantized(v);
                        let n = t["nbytes"].as_u64().unwrap();
                        t["nbytes"] = Value::from(n - 1);
                    })
                }),
                run_draft("{dir}/draft"),
                2,
                &["draft/trunk.json", "layer 1", "I8R", "nbytes"],
            ),
            case(
                "exact-pack-as-draft",
                "--draft-trunk given an exact trunk pack",
                |d: &Path| {
                    let o = k3(&args(&[
                        "pack",
                        &d.display().to_string(),
                        &d.join("pack").display().to_string(),
                    ]));
                    assert!(o.status.success());
                },
                run_draft("{dir}/pack"),
                2,
                &[
                    "pack/trunk.json",
                    "exact trunk pack, not a draft trunk",
                    "--draft-quant",
                ],
            ),
            case(
                "draft-as-exact-pack",
                "--trunk given a draft trunk",
                drafted(|_| {}),
                args(&[
                    "run",
                    "{dir}",
                    "--trunk",
                    "{dir}/draft",
                    "--mem-gb",
                    "0.003",
                    "--ids",
                    PROMPT,
                    "-n",
                    "2",
                ]),
                2,
                &["draft/trunk.json", "draft trunk", "--draft-trunk"],
            ),
            case(
                "hybrid-without-draft",
                "--draft hybrid without --draft-trunk",
                |_: &Path| {},
                args(&[
                    "run", "{dir}", "--draft", "hybrid", "--ids", PROMPT, "-n", "2",
                ]),
                2,
                &["--draft hybrid needs --draft-trunk"],
            ),
        ],
    );
}
