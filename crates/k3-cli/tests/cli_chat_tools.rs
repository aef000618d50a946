//! `k3 chat --tools FILE`: the tiny model's weights are random, so every call here is forced
//! with `--tool-choice`. The call line shown on stdout (`→ call NAME {JSON}`) is parsed and
//! validated against the tool's own schema by an independent validator (the `jsonschema`
//! crate), and matches the call kept in the saved history; `/tool RESULT` continues the
//! conversation; the saved JSONL reloads, and a hand-written one with two calls takes two
//! results in call order. With thinking on, the think channel is the same text with and
//! without the constraint (it stays free) while the call still validates. A call cut short
//! is dropped and the chat goes on. Bad tools files are refused naming the file and the
//! entry, a schema the constraint cannot enforce naming the keyword. Also on a terminal.

use rexpect::process::wait::WaitStatus;
use rexpect::session::spawn_command;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn tiny() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-k3")
        .to_string_lossy()
        .into_owned()
}

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": { "type": "string", "maxLength": 12 },
            "days": { "type": "integer", "minimum": 1, "maximum": 7 }
        },
        "required": ["city", "days"],
        "additionalProperties": false
    })
}

fn time_schema() -> Value {
    json!({
        "type": "object",
        "properties": { "zone": { "enum": ["UTC", "CET"] } },
        "required": ["zone"]
    })
}

/// A scratch directory with `tools.json`: one OpenAI-shaped tool and one bare one.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("k3-chat-tools-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": weather_schema()}},
        {"name": "get_time", "description": "Local time", "parameters": time_schema()}
    ]);
    std::fs::write(dir.join("tools.json"), tools.to_string()).unwrap();
    dir
}

/// `k3 chat` on the tiny model with `args`, fed `input` on stdin; fails unless it exits 0.
fn chat(args: &[&str], input: &str) -> String {
    let out = chat_output(args, input);
    assert!(
        out.status.success(),
        "k3 chat {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn chat_output(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["chat", &tiny(), "--threads", "2"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// The calls shown on stdout: (name, arguments parsed as JSON).
fn shown_calls(stdout: &str) -> Vec<(String, Value)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("→ call "))
        .map(|rest| {
            let (name, args) = rest.split_once(' ').expect("→ call NAME {JSON}");
            let args = serde_json::from_str(args)
                .unwrap_or_else(|e| panic!("shown arguments are not JSON ({e}): {args}"));
            (name.to_string(), args)
        })
        .collect()
}

fn assert_valid(schema: &Value, args: &Value) {
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(args).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{args} breaks {schema}: {errors:?}");
}

fn saved(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn forced_call_is_shown_validates_and_the_result_continues_the_chat() {
    let dir = scratch("forced");
    let (tools, jsonl) = (dir.join("tools.json"), dir.join("chat.jsonl"));
    let (tools_s, jsonl_s) = (tools.to_str().unwrap(), jsonl.to_str().unwrap());
    let input = format!(
        "What is the weather in Paris?\nand tomorrow?\n/tools\n/tool {{\"temp\": 21}}\n/tool one too many\n/save {jsonl_s}\n"
    );
    let args = [
        "--thinking",
        "off",
        "-n",
        "200",
        "--tools",
        tools_s,
        "--tool-choice",
        "get_weather",
    ];
    let stdout = chat(&args, &input);
    let calls = shown_calls(&stdout);
    assert_eq!(
        calls.len(),
        1,
        "one forced call, none after the result: {stdout}"
    );
    assert_eq!(calls[0].0, "get_weather");
    assert_valid(&weather_schema(), &calls[0].1);
    // A user message while the call waits is refused; /tools lists both tools.
    assert!(
        stdout.contains("waits for the result of `get_weather`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("get_weather(city*, days*)  Weather for a city"),
        "{stdout}"
    );
    assert!(stdout.contains("get_time(zone*)  Local time"), "{stdout}");
    assert!(
        stdout.contains("no tool call is waiting for a result"),
        "{stdout}"
    );

    // The history keeps the call (with an id) and the result answering it.
    let lines = saved(&jsonl);
    let roles: Vec<&str> = lines.iter().map(|v| v["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    let call = &lines[1]["tool_calls"][0];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], calls[0].1, "shown and saved calls agree");
    assert_eq!(lines[2]["tool_call_id"], call["id"]);
    assert_eq!(lines[2]["content"], "{\"temp\": 21}");
    assert!(
        lines[3].get("tool_calls").is_none(),
        "the reply to a result is not forced"
    );

    // It reloads (rendered with the tools declared) and the chat goes on from it.
    let input = format!("/load {jsonl_s}\n/stats\nthanks\n/stats\n");
    let stdout = chat(&args[..6], &input);
    assert!(stdout.contains("loaded 4 messages"), "{stdout}");
    assert!(stdout.contains("messages   6 "), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thinking_stays_free_while_the_call_is_constrained() {
    let dir = scratch("think");
    let tools = dir.join("tools.json");
    let tools_s = tools.to_str().unwrap();
    let reasoning_of = |extra: &[&str]| -> (Value, String) {
        let jsonl = dir.join(format!("t{}.jsonl", extra.len()));
        let mut args = vec![
            "--thinking",
            "low",
            "--think-budget",
            "24",
            "-n",
            "200",
            "--tools",
            tools_s,
        ];
        args.extend_from_slice(extra);
        let input = format!("What time is it?\n/save {}\n", jsonl.display());
        let stdout = chat(&args, &input);
        (saved(&jsonl)[1].clone(), stdout)
    };
    let (free, _) = reasoning_of(&[]);
    let (forced, stdout) = reasoning_of(&["--tool-choice", "required"]);
    let reasoning = forced["reasoning_content"].as_str().unwrap();
    assert!(!reasoning.is_empty());
    assert_eq!(
        forced["reasoning_content"], free["reasoning_content"],
        "the think channel must be the same text with and without --tool-choice"
    );
    assert!(
        free.get("tool_calls").is_none(),
        "the random model calls nothing unforced"
    );
    let calls = shown_calls(&stdout);
    assert_eq!(calls.len(), 1, "{stdout}");
    let schema = match calls[0].0.as_str() {
        "get_weather" => weather_schema(),
        "get_time" => time_schema(),
        other => panic!("called an undeclared tool {other}"),
    };
    assert_valid(&schema, &calls[0].1);
    assert_eq!(forced["tool_calls"][0]["arguments"], calls[0].1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_call_cut_short_is_dropped_and_the_chat_goes_on() {
    let dir = scratch("cut");
    let (tools, jsonl) = (dir.join("tools.json"), dir.join("chat.jsonl"));
    let args = [
        "--thinking",
        "off",
        "-n",
        // Greedy on the tiny model: 45 tokens end inside the call's arguments.
        "45",
        "--tools",
        tools.to_str().unwrap(),
        "--tool-choice",
        "get_weather",
    ];
    let input = format!("weather?\nweather?\n/save {}\n", jsonl.display());
    let stdout = chat(&args, &input);
    assert_eq!(
        stdout
            .matches("[call cut short: dropped] [length limit]")
            .count(),
        2,
        "{stdout}"
    );
    let lines = saved(&jsonl);
    assert_eq!(lines.len(), 4, "both exchanges kept: {lines:?}");
    assert!(lines.iter().all(|l| l.get("tool_calls").is_none()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_tools_files_are_refused_naming_file_and_entry() {
    let dir = scratch("bad");
    let cases: [(&str, &str, &str); 6] = [
        (
            "not-array.json",
            r#"{"name": "f"}"#,
            "must hold a JSON array",
        ),
        (
            "no-name.json",
            r#"[{"name": "f"}, {"description": "x"}]"#,
            "tool 2: no `name` string",
        ),
        (
            "kind.json",
            r#"[{"type": "retrieval"}]"#,
            "tool 1: `type` is \"retrieval\"",
        ),
        (
            "twice.json",
            r#"[{"name": "f"}, {"name": "f"}]"#,
            "tool 2: the name `f` is declared twice",
        ),
        (
            "params.json",
            r#"[{"name": "f", "parameters": 3}]"#,
            "tool 1: tool `f`: `parameters` must be",
        ),
        ("json.json", "[{", "json.json:1:"),
    ];
    for (file, text, why) in cases {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let out = chat_output(&["--tools", path.to_str().unwrap()], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(
            stderr.contains(file) && stderr.contains(why),
            "{file}: {stderr}"
        );
    }
    let tools = dir.join("tools.json");
    let out = chat_output(
        &["--tools", tools.to_str().unwrap(), "--tool-choice", "nope"],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--tool-choice nope: no such tool"),
        "{stderr}"
    );
    assert!(stderr.contains("get_weather, get_time"), "{stderr}");
    let out = chat_output(&["--tool-choice", "required"], "");
    assert_eq!(out.status.code(), Some(2), "--tool-choice needs --tools");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tool_calls_on_a_terminal() {
    let dir = scratch("pty");
    let tools = dir.join("tools.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args([
        "chat",
        &tiny(),
        "--threads",
        "2",
        "--thinking",
        "off",
        "-n",
        "200",
    ])
    .args(["--no-history", "--tool-choice", "get_time", "--tools"])
    .arg(&tools)
    .env("TERM", "xterm");
    let mut p = spawn_command(cmd, Some(60_000)).expect("k3 chat starts in a pty");
    p.exp_string("/tool RESULT").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/tools").unwrap();
    p.exp_string("get_time(zone*)  Local time").unwrap();
    p.send_line("What time is it?").unwrap();
    // Bold on a terminal, then the call and its JSON arguments on one line (rexpect reads
    // bytes as Latin-1: the arrow's three UTF-8 bytes are three characters here).
    let (_, args) = p
        .exp_regex("\x1b\\[1m\u{e2}\u{86}\u{92} call get_time \\{[^\r\n]*\\}")
        .unwrap();
    let shown: Value = serde_json::from_str(&args[args.find('{').unwrap()..]).unwrap();
    assert_valid(&time_schema(), &shown);
    p.send_line("/tool 12:00").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+4 ").unwrap();
    // /undo drops the result and the reply to it: the call waits for a result again.
    p.send_line("/undo").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+2 ").unwrap();
    p.send_line("later").unwrap();
    p.exp_string("waits for the result of `get_time`").unwrap();
    p.send_line("/tool 13:00").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+4 ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    let status = p.process.wait().unwrap();
    assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_loaded_history_with_two_calls_takes_two_results_in_order() {
    let dir = scratch("two");
    let (tools, history, out) = (
        dir.join("tools.json"),
        dir.join("in.jsonl"),
        dir.join("out.jsonl"),
    );
    // Written by hand in the documented JSONL shape (README "Chat"), not by k3.
    let lines = [
        json!({"role": "user", "content": "Weather and time in Paris?"}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "name": "get_weather", "arguments": {"city": "Paris", "days": 1}},
            {"id": "b", "name": "get_time", "arguments": {"zone": "CET"}}]}),
    ];
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&history, text.join("\n") + "\n").unwrap();
    let input = format!(
        "/load {}\nhello\n/tool sunny\n/tool 12:00\n/save {}\n",
        history.display(),
        out.display()
    );
    let args = [
        "--thinking",
        "off",
        "-n",
        "8",
        "--tools",
        tools.to_str().unwrap(),
    ];
    let stdout = chat(&args, &input);
    assert!(
        stdout.contains("model called 2 tool(s) and waits for the result of `get_weather`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("result of `get_weather` recorded; next: /tool RESULT for `get_time`"),
        "{stdout}"
    );
    let saved = saved(&out);
    let roles: Vec<&str> = saved.iter().map(|v| v["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "assistant"]);
    assert_eq!(
        (&saved[2]["tool_call_id"], &saved[2]["content"]),
        (&json!("a"), &json!("sunny"))
    );
    assert_eq!(
        (&saved[3]["tool_call_id"], &saved[3]["name"]),
        (&json!("b"), &json!("get_time"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_schema_the_constraint_cannot_enforce_is_refused_at_start() {
    let dir = scratch("schema");
    let tools = dir.join("odd.json");
    let odd = json!([{"name": "f", "parameters": {"type": "object",
        "properties": {"s": {"type": "string", "pattern": "^a+$"}}, "required": ["s"]}}]);
    std::fs::write(&tools, odd.to_string()).unwrap();
    let args = [
        "--tools",
        tools.to_str().unwrap(),
        "--tool-choice",
        "required",
    ];
    let out = chat_output(&args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--tool-choice: ") && stderr.contains("pattern"),
        "{stderr}"
    );
    // Declared without --tool-choice, the same tool is fine (nothing is compiled).
    assert!(chat_output(&args[..2], "").status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
