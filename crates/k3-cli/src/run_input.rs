//! What `k3 run` runs on: the model directory (the positional MODEL_DIR, `-m/--model`, or the
//! config file's `model`), the prompt (a positional PROMPT, `-p`, `-f FILE` with `-` for
//! stdin, or `--ids`), and the check that prompt plus `-n` fit the context.

use crate::ids::parse_ids;
use crate::run_args::RunArgs;
use crate::CliError;
use k3_engine::config_file::FileConfig;
use k3_engine::Engine;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The prompt as given, read (files and stdin) but not yet tokenized.
pub enum Prompt {
    /// `--ids`: token ids, used as they are.
    Ids(Vec<u32>),
    /// `-p` or the positional PROMPT.
    Text(String),
    /// `-f FILE` or `-f -`: bytes read verbatim (invalid UTF-8 is encoded from its bytes).
    Bytes(Vec<u8>),
}

/// The model directory and the prompt of one `k3 run`.
pub struct Inputs {
    pub model_dir: PathBuf,
    pub prompt: Prompt,
}

/// Works out the model directory and reads the prompt. With `-m`, the first positional is
/// the prompt; without, it is the model directory and the second is the prompt.
pub fn resolve(args: &RunArgs, file: &FileConfig) -> Result<Inputs, CliError> {
    let (model, positional) = match &args.model {
        Some(m) => {
            if let (Some(dir), Some(_)) = (&args.model_dir, &args.prompt_pos) {
                return Err(CliError::usage(format!(
                    "the model directory is given twice (-m {} and {}): give one",
                    m.display(),
                    dir.display()
                )));
            }
            let text = args.model_dir.as_deref().map(path_as_prompt).transpose()?;
            (Some(m.clone()), text)
        }
        None => (args.model_dir.clone(), args.prompt_pos.clone()),
    };
    let prompt = read_prompt(args, positional)?;
    let model_dir = model
        .or_else(|| file.model.clone())
        .ok_or_else(crate::engine_args::no_model)?;
    // A stored NAME (`k3 pull`) stands for its directory (docs/MODELS.md).
    let model_dir = k3_hub::store::resolve_model(&model_dir)?;
    Ok(Inputs { model_dir, prompt })
}

/// `k3 run MODEL` with no prompt anywhere, on a terminal (stdin and stdout): opens a chat
/// instead of refusing (ollama's habit).
pub fn wants_chat(args: &RunArgs) -> bool {
    use std::io::IsTerminal;
    let positional_prompt = match &args.model {
        Some(_) => args.model_dir.is_some(),
        None => args.prompt_pos.is_some(),
    };
    let any_prompt = positional_prompt
        || args.ids.is_some()
        || args.prompt.is_some()
        || args.prompt_file.is_some()
        || args.load_session.is_some();
    !any_prompt && std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// A positional argument taken as prompt text (after `-m DIR`).
fn path_as_prompt(p: &Path) -> Result<String, CliError> {
    p.to_str().map(str::to_owned).ok_or_else(|| {
        CliError::usage("the positional PROMPT is not valid UTF-8: pass it with -f FILE")
    })
}

/// The one prompt among `--ids`, `-p`, `-f` and the positional PROMPT, read.
fn read_prompt(args: &RunArgs, positional: Option<String>) -> Result<Prompt, CliError> {
    let given = [
        ("--ids", args.ids.is_some()),
        ("-p/--prompt", args.prompt.is_some()),
        ("-f/--prompt-file", args.prompt_file.is_some()),
        ("a positional PROMPT", positional.is_some()),
    ];
    let names: Vec<&str> = given.iter().filter(|(_, g)| *g).map(|(n, _)| *n).collect();
    if names.len() > 1 {
        return Err(CliError::usage(format!(
            "give one prompt, not {}",
            names.join(" and ")
        )));
    }
    if let Some(text) = &args.ids {
        return parse_ids(text).map(Prompt::Ids).map_err(CliError::usage);
    }
    if let Some(text) = args.prompt.clone().or(positional) {
        return Ok(match args.escape {
            true => Prompt::Bytes(k3_tokenizer::escape::unescape(&text)),
            false => Prompt::Text(text),
        });
    }
    match &args.prompt_file {
        Some(path) => read_prompt_file(path).map(Prompt::Bytes),
        None => Err(CliError::usage(
            "give a prompt: k3 run MODEL_DIR \"TEXT\", -p TEXT, -f FILE (- reads stdin) or --ids 1,2,3",
        )),
    }
}

/// The bytes of a prompt file, or of stdin for `-`.
fn read_prompt_file(path: &Path) -> Result<Vec<u8>, CliError> {
    if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| CliError::usage(format!("cannot read the prompt from stdin: {e}")))?;
        return Ok(bytes);
    }
    std::fs::read(path)
        .map_err(|e| CliError::usage(format!("{}: cannot read prompt file: {e}", path.display())))
}

impl Prompt {
    /// The prompt's token ids; text needs the engine's tokenizer.
    pub fn ids(
        &self,
        engine: &Engine,
        dir: &Path,
        allow_special: bool,
    ) -> Result<Vec<u32>, CliError> {
        if let Prompt::Ids(ids) = self {
            return Ok(ids.clone());
        }
        let tok = engine.tokenizer().ok_or_else(|| {
            CliError::usage(format!(
                "{}: no tokenizer (tiktoken.model or tokenizer.json) for a text prompt: pass --tok DIR or use --ids",
                dir.display()
            ))
        })?;
        Ok(match self {
            Prompt::Text(text) => tok.encode(text, allow_special),
            Prompt::Bytes(bytes) => tok.encode_bytes(bytes, allow_special),
            Prompt::Ids(ids) => ids.clone(),
        })
    }
}

/// Refuses a run whose tokens cannot fit the context, before anything is fed: `held` tokens
/// of a loaded session, the prompt, and `n` generated tokens (each one occupies a position).
pub fn check_room(held: usize, prompt: usize, n: usize, ctx: usize) -> Result<(), CliError> {
    let need = held + prompt + n;
    if need <= ctx {
        return Ok(());
    }
    let what = if held > 0 {
        format!("the loaded session ({held} tokens), the prompt ({prompt} tokens) and -n {n} need")
    } else {
        format!("the prompt ({prompt} tokens) and -n {n} need")
    };
    Err(CliError::usage(format!(
        "{what} {need} positions but the context has {ctx}: lower -n or raise -c/--ctx to at least {need}"
    )))
}

#[cfg(test)]
mod tests {
    use super::check_room;

    #[test]
    fn room_counts_every_position() {
        assert!(check_room(0, 7, 4, 11).is_ok());
        let e = check_room(0, 7, 4, 10).unwrap_err().message;
        assert!(e.contains("prompt (7 tokens) and -n 4 need 11 positions but the context has 10"));
        assert!(e.contains("-c/--ctx to at least 11"), "{e}");
        let e = check_room(5, 2, 4, 10).unwrap_err().message;
        assert!(e.contains("loaded session (5 tokens)"), "{e}");
    }
}
