//! Command-line flags: bad values and conflicting flags exit 2 naming the flag or the value,
//! before any weight is read; `-n 0` is valid and generates nothing.

use crate::common::*;

fn nothing(_: &std::path::Path) {}

/// `k3 run {dir}` plus `extra`.
fn run(extra: &[&str]) -> Vec<String> {
    let mut a = args(&["run", "{dir}"]);
    a.extend(args(extra));
    a
}

fn cases() -> Vec<Case> {
    let ids = |v: &str| run(&[&format!("--ids={v}"), "-n", "1"]);
    vec![
        case(
            "ids-non-numeric",
            "--ids 1,abc",
            nothing,
            ids("1,abc"),
            2,
            &["--ids entry 2 is \"abc\": not a decimal token id"],
        ),
        case(
            "ids-negative",
            "--ids -3",
            nothing,
            ids("-3"),
            2,
            &["--ids entry 1 is \"-3\": token ids cannot be negative"],
        ),
        case(
            "ids-beyond-vocab",
            "--ids 5000 (vocab 1024)",
            nothing,
            ids("5000"),
            2,
            &["5000", "vocab_size is 1024"],
        ),
        case(
            "ids-at-vocab",
            "--ids 1024 (first id past the vocab)",
            nothing,
            ids("1,1024"),
            2,
            &["1024", "vocab_size is 1024"],
        ),
        case(
            "ids-overflow-u32",
            "--ids 4294967301",
            nothing,
            ids("4294967301"),
            2,
            &["--ids entry 1 is 4294967301: larger than the largest possible token id 4294967295"],
        ),
        case(
            "ids-empty",
            "--ids \"\"",
            nothing,
            ids(""),
            2,
            &["--ids is empty"],
        ),
        case(
            "ids-stray-comma",
            "--ids 1,,2",
            nothing,
            ids("1,,2"),
            2,
            &["--ids entry 2 is empty (stray comma?)"],
        ),
        case(
            "ids-trailing-comma",
            "--ids 1,2,",
            nothing,
            ids("1,2,"),
            2,
            &["--ids entry 3 is empty (stray comma?)"],
        ),
        case(
            "ids-float",
            "--ids 1.5",
            nothing,
            ids("1.5"),
            2,
            &["--ids entry 1 is \"1.5\": not a decimal token id"],
        ),
        case(
            "n-not-a-number",
            "-n abc",
            nothing,
            run(&["--ids", "1", "-n", "abc"]),
            2,
            &["invalid value 'abc' for '--gen <GEN>'"],
        ),
        case(
            "n-negative",
            "-n -1",
            nothing,
            run(&["--ids", "1", "-n", "-1"]),
            2,
            &["invalid value '-1' for '--gen"],
        ),
        case(
            "n-negative-attached",
            "-n=-1",
            nothing,
            run(&["--ids", "1", "-n=-1"]),
            2,
            &["invalid value '-1' for '--gen <GEN>'"],
        ),
        case(
            "ids-with-prompt",
            "--ids with --prompt",
            nothing,
            run(&["--ids", "1", "--prompt", "x"]),
            2,
            &["'--ids <IDS>' cannot be used with '--prompt <PROMPT>'"],
        ),
        case(
            "no-prompt",
            "neither --ids nor --prompt",
            nothing,
            run(&["-n", "1"]),
            2,
            &["--ids <IDS>|--prompt <PROMPT>|--prompt-file <PROMPT_FILE>"],
        ),
        case(
            "preset-with-mem-gb",
            "--preset laptop --mem-gb 1",
            nothing,
            run(&["--ids", "1", "--preset", "laptop", "--mem-gb", "1"]),
            2,
            &["'--preset <PRESET>' cannot be used with '--mem-gb <MEM_GB>'"],
        ),
        case(
            "trunk-gb-alone",
            "--trunk-gb 1 without --cache-gb",
            nothing,
            run(&["--ids", "1", "--trunk-gb", "1"]),
            2,
            &["--cache-gb <CACHE_GB>"],
        ),
        case(
            "unknown-preset",
            "--preset huge",
            nothing,
            run(&["--ids", "1", "--preset", "huge"]),
            2,
            &["unknown preset `huge`", "laptop"],
        ),
        case(
            "mem-gb-zero",
            "--mem-gb 0",
            nothing,
            run(&["--ids", "1", "--mem-gb", "0"]),
            2,
            &["--mem-gb must be a positive number of GB, got 0"],
        ),
        case(
            "mem-gb-negative",
            "--mem-gb=-2",
            nothing,
            run(&["--ids", "1", "--mem-gb=-2"]),
            2,
            &["--mem-gb must be a positive number of GB, got -2"],
        ),
        case(
            "mem-gb-nan",
            "--mem-gb NaN",
            nothing,
            run(&["--ids", "1", "--mem-gb", "NaN"]),
            2,
            &["--mem-gb must be a positive number of GB, got NaN"],
        ),
        case(
            "mem-gb-inf",
            "--mem-gb inf",
            nothing,
            run(&["--ids", "1", "--mem-gb", "inf"]),
            2,
            &["--mem-gb must be a positive number of GB, got inf"],
        ),
        case(
            "cache-gb-zero",
            "--trunk-gb 1 --cache-gb 0",
            nothing,
            run(&["--ids", "1", "--trunk-gb", "1", "--cache-gb", "0"]),
            2,
            &["--cache-gb must be a positive number of GB, got 0"],
        ),
        case(
            "threads-zero",
            "--threads 0",
            nothing,
            run(&["--ids", "1", "--threads", "0"]),
            2,
            &["--threads must be at least 1"],
        ),
        case(
            "ctx-zero",
            "--ctx 0",
            nothing,
            run(&["--ids", "1", "--ctx", "0"]),
            2,
            &["context length must be at least 1"],
        ),
        case(
            "ctx-too-small",
            "--ctx 1 with a 2-token prompt",
            nothing,
            run(&["--ids", "1,2", "--ctx", "1"]),
            2,
            &["context of 1 positions", "raise --ctx"],
        ),
        case(
            "missing-model-dir",
            "model directory does not exist",
            nothing,
            args(&["run", "/nonexistent/k3-hostile-model", "--ids", "1"]),
            2,
            &["/nonexistent/k3-hostile-model", "not a directory"],
        ),
        case(
            "model-dir-is-file",
            "model path is config.json",
            nothing,
            args(&["run", "{dir}/config.json", "--ids", "1"]),
            2,
            &["config.json: not a directory"],
        ),
        case(
            "prompt-file-missing",
            "--prompt-file that does not exist",
            nothing,
            run(&["--prompt-file", "/nonexistent/k3-prompt.txt"]),
            2,
            &["/nonexistent/k3-prompt.txt: cannot read prompt file"],
        ),
        case(
            "plan-missing-dir",
            "k3 plan on a missing directory",
            nothing,
            args(&["plan", "/nonexistent/k3-m", "--preset", "laptop"]),
            2,
            &["/nonexistent/k3-m/config.json"],
        ),
        case(
            "decode-beyond-vocab",
            "k3 tokenize --decode 5000",
            nothing,
            args(&["tokenize", "{dir}", "--decode", "5000"]),
            2,
            &["token id 5000 is not in the vocabulary (size 1024)"],
        ),
        case(
            "n-zero",
            "-n 0 (valid: generates nothing)",
            nothing,
            run(&["--ids", PROMPT, "-n", "0"]),
            0,
            &["generated ids:"],
        ),
    ]
}

#[test]
fn bad_flags_are_usage_errors_naming_the_flag() {
    check_all("cli", cases());
}
