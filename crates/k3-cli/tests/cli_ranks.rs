//! `k3 plan --ranks N` (with and without a model, table and JSON) and `k3 run --json`'s
//! `ranks` (docs/DISTRIBUTED.md#memory-per-rank).

mod common;
use common::{k3, tiny_arg};

fn json_of(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

#[test]
fn plan_ranks_with_a_model_gives_each_rank_its_share() {
    let model = tiny_arg();
    let one = json_of(&k3(&[
        "plan", &model, "--mem-gb", "0.004", "--ranks", "1", "--json",
    ]));
    let three = json_of(&k3(&[
        "plan", &model, "--mem-gb", "0.004", "--ranks", "3", "--json",
    ]));
    assert_eq!(one["per_rank"].as_array().unwrap().len(), 1);
    assert_eq!(one["exchange_per_token"]["collectives"], 0);
    let rows = three["per_rank"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let whole_owned = one["per_rank"][0]["owned_experts"].as_u64().unwrap();
    let owned: u64 = rows
        .iter()
        .map(|r| r["owned_experts"].as_u64().unwrap())
        .sum();
    assert_eq!(owned, whole_owned);
    // one process at 4 MB pins 4 of 13 layers and streams the rest; a rank's share is
    // small enough that each of 3 ranks, with the same 4 MB, pins all 13
    let solo = &one["per_rank"][0];
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    assert!(u(solo, "trunk_bytes_per_token") > 0, "{solo}");
    let whole_trunk = u(solo, "trunk_pinned_bytes") + u(solo, "trunk_bytes_per_token");
    for (q, r) in rows.iter().enumerate() {
        assert_eq!(r["rank"], q);
        assert_eq!(u(r, "trunk_pinned_layers"), 13, "{r}");
        assert_eq!(u(r, "trunk_bytes_per_token"), 0, "{r}");
        assert!(
            u(r, "trunk_pinned_bytes") * 10 < whole_trunk * 6,
            "{r} vs {whole_trunk}"
        );
    }
    let x = &three["exchange_per_token"];
    assert!(x["collectives"].as_u64().unwrap() > 0);
    assert!(x["bytes_received_per_rank"].as_u64() < x["bytes_total"].as_u64());
    let table = k3(&["plan", &model, "--mem-gb", "0.004", "--ranks", "2"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("over 2 ranks") && text.contains("collectives"),
        "{text}"
    );
}

#[test]
fn plan_ranks_without_a_model_plans_the_release_per_rank() {
    // the fit check against this machine may refuse (exit 2) after printing the plan
    let o = k3(&["plan", "--ranks", "4", "--preset", "laptop", "--json"]);
    assert!(matches!(o.status.code(), Some(0 | 2)), "{o:?}");
    let v = json_of(&o);
    let rows = v["per_rank"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    // 82,432 routed experts (92 MoE layers x 896) dealt over 4 ranks
    assert_eq!(rows[0]["owned_experts"], 92 * 224);
    assert!(v["exchange_per_token"]["collectives"].as_u64().unwrap() > 93);
    let bad = k3(&["plan", "--ranks", "0"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--ranks"));
}

#[test]
fn run_json_has_one_rank_entry_per_process() {
    let dir = std::env::temp_dir().join(format!("k3-cli-ranks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let model = tiny_arg();
    let o = k3(&[
        "run",
        &model,
        "--ids",
        "1,2,3",
        "-n",
        "3",
        "--mem-gb",
        "0.005",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let ranks = r["ranks"].as_array().expect("ranks is an array");
    assert_eq!(ranks.len(), 1);
    let me = &ranks[0];
    assert_eq!(me["rank"], 0);
    assert!(me["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert_eq!(me["bytes_read_trunk"], r["bytes_read_trunk"]);
    assert_eq!(me["bytes_read_experts"], r["bytes_read_experts"]);
    assert_eq!(me["collective_calls"], 0);
    for k in [
        "collective_bytes_sent",
        "collective_bytes_received",
        "collective_seconds",
    ] {
        assert!(me.get(k).is_some(), "{k} missing: {me}");
    }
}
