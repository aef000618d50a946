//! `k3 run --json-schema FILE` / `--json-object` on tiny-k3 (random weights) at temperature 1:
//! stdout is one JSON value that parses and validates (the `jsonschema` crate, independent of
//! the grammar) on a dozen seeds; bad schema files, unsatisfiable schemas and incompatible
//! flags are refused with exit 2 naming the problem; a reply cut off by -n exits 1.

mod common;
use common::{k3, scratch_dir, stderr, stdout, tiny_arg as tiny, Scratch};
use serde_json::{json, Value};
use std::path::PathBuf;

/// `schema` written to `schema.json` in a fresh scratch directory (removed when the returned
/// guard drops): the guard and the file's path.
fn schema_file(name: &str, schema: &str) -> (Scratch, PathBuf) {
    let dir = scratch_dir("structured", name);
    let path = dir.join("schema.json");
    std::fs::write(&path, schema).unwrap();
    (dir, path)
}

fn bounded() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": { "type": "string", "maxLength": 10 },
            "temp_c": { "type": "integer", "minimum": -40, "maximum": 50 },
            "sky": { "enum": ["clear", "cloudy", "rain"] },
            "hours": { "type": "array", "items": { "type": "integer", "minimum": 0, "maximum": 23 }, "maxItems": 4 },
            "wind": {
                "type": "object",
                "properties": { "kmh": { "type": "integer", "minimum": 0, "maximum": 200 }, "gusts": { "type": "boolean" } },
                "required": ["kmh"], "additionalProperties": false
            }
        },
        "required": ["city", "temp_c", "sky", "wind"],
        "additionalProperties": false
    })
}

#[test]
fn json_schema_stdout_validates_on_a_dozen_seeds() {
    let schema = bounded();
    let (_path_dir, path) = schema_file("dozen", &schema.to_string());
    let validator = jsonschema::validator_for(&schema).unwrap();
    let model = tiny();
    for seed in 0..12 {
        let seed = seed.to_string();
        let o = k3(&[
            "run",
            &model,
            "-p",
            "Weather in Paris as JSON",
            "--json-schema",
            path.to_str().unwrap(),
            "-n",
            "200",
            "--temp",
            "1",
            "--seed",
            &seed,
            "-q",
        ]);
        assert!(o.status.success(), "seed {seed}: {}", stderr(&o));
        let out = stdout(&o);
        let value: Value = serde_json::from_str(out.trim_end())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}: {out}"));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "seed {seed}: {out}: {errors:?}");
    }
}

#[test]
fn json_object_stdout_is_an_object() {
    let model = tiny();
    // An unbounded object may not finish within -n on random weights; some seeds must.
    let mut finished = 0;
    for seed in 0..4 {
        let seed = seed.to_string();
        let o = k3(&[
            "run",
            &model,
            "-p",
            "JSON please",
            "--json-object",
            "-n",
            "120",
            "--temp",
            "1",
            "--seed",
            &seed,
            "-q",
        ]);
        match o.status.code() {
            Some(0) => {
                let v: Value = serde_json::from_str(stdout(&o).trim_end()).unwrap();
                assert!(v.is_object(), "{v}");
                finished += 1;
            }
            Some(1) => assert!(
                stderr(&o).contains("did not finish within -n 120"),
                "{}",
                stderr(&o)
            ),
            c => panic!("exit {c:?}: {}", stderr(&o)),
        }
    }
    assert!(finished > 0, "no --json-object reply finished");
}

#[test]
fn refusals_name_the_problem() {
    let model = tiny();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", model.as_str(), "-q"];
        args.extend_from_slice(extra);
        k3(&args)
    };
    let (_bad_json_dir, bad_json) = schema_file("bad-json", "{\"type\":\n");
    let o = run(&["-p", "x", "--json-schema", bad_json.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("schema.json:2:"), "{}", stderr(&o));
    let (_unsat_dir, unsat) = schema_file("unsat", r#"{"type":"integer","minimum":3,"maximum":1}"#);
    let o = run(&["-p", "x", "--json-schema", unsat.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("minimum (3) is greater than maximum (1)"),
        "{}",
        stderr(&o)
    );
    let (_ok_dir, ok) = schema_file("ok", &bounded().to_string());
    let o = run(&["--ids", "1,2", "--json-schema", ok.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not --ids"), "{}", stderr(&o));
    let o = run(&[
        "-p",
        "x",
        "--json-object",
        "--json-schema",
        ok.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["-p", "x", "--json-schema", ok.to_str().unwrap(), "-n", "3"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("did not finish within -n 3"),
        "{}",
        stderr(&o)
    );
}
