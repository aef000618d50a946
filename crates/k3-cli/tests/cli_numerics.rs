//! `--numerics` (docs/NUMERICS.md#numeric-mode-fast): `fast` runs where this machine has
//! usable AMX-BF16 tiles and is refused with exit 2 elsewhere, before any weight is read;
//! `v2` is the default; any other value is a usage error.

mod common;
use common::{k3, stderr, tiny_arg};

const IDS: &str = "637,229,263,638,730,42,197";
/// The tiny model's greedy ids after `IDS` under contract v2 (as in cli_run.rs).
const V2_IDS: &str = "391,655,292,730";

fn run(numerics: &[&str]) -> std::process::Output {
    let model = tiny_arg();
    let mut args = vec!["run", &model, "--ids", IDS, "-n", "4", "--print-ids"];
    args.extend_from_slice(numerics);
    k3(&args)
}

#[test]
fn v2_is_the_default_and_gives_the_same_ids() {
    for flags in [&[][..], &["--numerics", "v2"]] {
        let o = run(flags);
        assert_eq!(o.status.code(), Some(0), "{flags:?}: {}", stderr(&o));
        let want = format!("generated ids: {V2_IDS}\n");
        assert!(stderr(&o).contains(&want), "{flags:?}: {}", stderr(&o));
    }
}

#[test]
fn fast_runs_with_amx_and_is_refused_without() {
    let o = run(&["--numerics", "fast"]);
    let err = stderr(&o);
    if k3_kernels::fast::amx_usable() {
        assert_eq!(o.status.code(), Some(0), "{err}");
        let ids = err
            .lines()
            .find_map(|l| l.strip_prefix("generated ids: "))
            .unwrap_or_else(|| panic!("no generated ids: {err}"));
        assert_eq!(ids.split(',').count(), 4, "{err}");
        return;
    }
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("numeric mode fast needs AMX-BF16 tiles")
            && err.contains("run without --numerics (contract v2)"),
        "{err}"
    );
    assert_eq!(err.matches("k3: error:").count(), 1, "reported once: {err}");
    assert!(!err.contains("generated ids"), "{err}");
    // chat and serve are refused alike, before opening the model or binding a port
    let model = tiny_arg();
    for cmd in [
        vec!["chat", &model, "--numerics", "fast"],
        vec!["serve", &model, "--port", "0", "--numerics", "fast"],
    ] {
        let o = k3(&cmd);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(
            err.contains("run without --numerics (contract v2)"),
            "{cmd:?}: {err}"
        );
    }
}

#[test]
fn other_modes_are_usage_errors() {
    let model = tiny_arg();
    for cmd in ["run", "chat", "serve"] {
        for bad in ["bogus", "amx-bf16x1"] {
            let o = k3(&[cmd, &model, "--numerics", bad]);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{cmd} {bad}: {err}");
            assert!(
                err.contains(&format!("invalid value '{bad}'")) && err.contains("v2, fast"),
                "{cmd} {bad}: {err}"
            );
        }
    }
}
