//! `k3 run --json-schema FILE` / `--json-object`: structured output on the command line
//! (docs/API.md#structured-output). The prompt is rendered as one user message of the chat
//! template with thinking off, the reply is constrained to one JSON value (valid for the
//! schema) in the response channel, and stdout carries that JSON and nothing else.

use crate::run_args::RunArgs;
use crate::run_input::Prompt;
use crate::CliError;
use k3_engine::chat_template::{self as chat, ChatMessage, Thinking};
use k3_engine::{Constraint, ConstraintSpec, Engine, ReplyStart, Sampler, Tokenizer};
use std::path::Path;

/// The constraint the flags ask for, if any (the schema file read and parsed).
pub fn spec(args: &RunArgs) -> Result<Option<ConstraintSpec>, CliError> {
    let spec = match (&args.json_schema, args.json_object) {
        (Some(_), true) => {
            return Err(CliError::usage(
                "give one of --json-schema FILE and --json-object",
            ))
        }
        (Some(path), false) => ConstraintSpec::JsonSchema {
            schema: read_schema(path)?,
            strict: true,
        },
        (None, true) => ConstraintSpec::JsonObject,
        (None, false) => return Ok(None),
    };
    if args.ids.is_some() {
        return Err(CliError::usage(
            "--json-schema/--json-object render the prompt as a chat message: give it as text (-p, -f or the positional PROMPT), not --ids",
        ));
    }
    if args.ignore_eos {
        return Err(CliError::usage(
            "--ignore-eos cannot be combined with --json-schema/--json-object: the reply ends where its JSON does",
        ));
    }
    Ok(Some(spec))
}

/// The schema in `path`; errors name the file and, for bad JSON, the line and column.
fn read_schema(path: &Path) -> Result<serde_json::Value, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::usage(format!(
            "{}: cannot read the JSON schema: {e}",
            path.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| {
        CliError::usage(format!(
            "{}:{}:{}: not a JSON schema: {e}",
            path.display(),
            e.line(),
            e.column()
        ))
    })
}

/// The engine's tokenizer, which structured output needs.
pub fn tokenizer<'e>(engine: &'e Engine, dir: &Path) -> Result<&'e Tokenizer, CliError> {
    engine.tokenizer().ok_or_else(|| {
        CliError::usage(format!(
            "{}: --json-schema/--json-object need a tokenizer (tiktoken.model or tokenizer.json, or --tok DIR)",
            dir.display()
        ))
    })
}

/// `prompt` as one user message, then the assistant's reply opened in the response channel.
pub fn chat_prompt(tok: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, CliError> {
    let text = match prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Prompt::Ids(_) => unreachable!("refused by spec()"),
    };
    let user = ChatMessage::new("user", text);
    Ok(chat::render(tok, &[user], Thinking::Off, true)?)
}

/// `sampler` constrained by `spec` (refused up front when the schema cannot be enforced).
pub fn constrain(
    sampler: Sampler,
    tok: &Tokenizer,
    spec: &ConstraintSpec,
) -> Result<Sampler, CliError> {
    let constraint = Constraint::new(tok, spec, ReplyStart::Response)?;
    Ok(sampler.with_constraint(constraint))
}

/// Refuses (exit 1) a reply whose JSON was cut off by `-n` before it completed.
pub fn check_complete(sampler: &Sampler, n: usize) -> Result<(), CliError> {
    if let Some(why) = sampler.constraint_failure() {
        return Err(CliError::runtime(why.to_string()));
    }
    match sampler.constraint() {
        Some(c) if !c.is_finished() => Err(CliError::runtime(format!(
            "the JSON reply did not finish within -n {n} tokens: raise -n (or bound the schema's strings and arrays with maxLength / maxItems)"
        ))),
        _ => Ok(()),
    }
}
