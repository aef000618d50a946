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
    }
    let o = k3(&["presets", "--read-gbps", "0"]);
    assert_eq!(o.status.code(), Some(2));
}
