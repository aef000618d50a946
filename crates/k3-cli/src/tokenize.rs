//! `k3 tokenize`: encode text to ids, decode ids to text (or list each token with its id),
//! or export a `tokenizer.json`.

use crate::ids::parse_ids;
use crate::CliError;
use clap::Args;
use k3_tokenizer::escape::{escape_bytes, Style};
use k3_tokenizer::Tokenizer;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["text", "file", "decode", "export"])))]
#[command(
    after_help = "Examples:\n  k3 tokenize fixtures/tiny-k3 --text 'Hello, world'\n  echo 'Hello' | k3 tokenize fixtures/tiny-k3 --file -\n  k3 tokenize fixtures/tiny-k3 --decode 341,464\n  k3 tokenize fixtures/tiny-k3 --decode 341,464 --show-tokens\n  k3 tokenize fixtures/tiny-k3 --export tokenizer.json"
)]
pub struct TokenizeArgs {
    /// Tokenizer directory (tiktoken.model + tokenizer_config.json, or tokenizer.json); a
    /// model directory works.
    pub tok_dir: PathBuf,
    /// Text to encode.
    #[arg(long)]
    pub text: Option<String>,
    /// File to encode, bytes read verbatim; `-` reads stdin.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Comma-separated ids to decode.
    #[arg(long)]
    pub decode: Option<String>,
    /// Write the tokenizer as a Hugging Face tokenizer.json to this path.
    #[arg(long)]
    pub export: Option<PathBuf>,
    /// Encode control-token text (e.g. `<|open|>`) as control tokens.
    #[arg(long)]
    pub allow_special: bool,
    /// One line per token instead: its id, a tab, and its text in quotes (escapes for
    /// control characters, quotes, backslashes and bytes that are not UTF-8).
    #[arg(long, conflicts_with = "export")]
    pub show_tokens: bool,
    /// Print JSON instead of comma-separated ids.
    #[arg(long)]
    pub json: bool,
}

/// Prints each token of `ids` with its id (`--show-tokens`), as lines or as JSON.
fn show_tokens(tok: &Tokenizer, ids: &[u32], json: bool) -> Result<(), CliError> {
    let mut pieces = Vec::with_capacity(ids.len());
    for &id in ids {
        let bytes = tok
            .decode(&[id])
            .map_err(|e| CliError::usage(e.to_string()))?;
        pieces.push((id, escape_bytes(&bytes, Style::Quoted)));
    }
    if json {
        let tokens: Vec<_> = pieces
            .iter()
            .map(|(id, p)| serde_json::json!({ "id": id, "piece": p }))
            .collect();
        println!("{}", serde_json::json!({ "tokens": tokens }));
        return Ok(());
    }
    for (id, piece) in pieces {
        println!("{id}\t\"{piece}\"");
    }
    Ok(())
}

/// The bytes of `path`, or of stdin for `-`.
fn read_file(path: &std::path::Path) -> Result<Vec<u8>, CliError> {
    if path == std::path::Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
            .map_err(|e| CliError::usage(format!("cannot read stdin: {e}")))?;
        return Ok(bytes);
    }
    std::fs::read(path).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))
}

pub fn tokenize(mut args: TokenizeArgs) -> Result<(), CliError> {
    // A stored NAME (`k3 pull`) stands for its directory (docs/MODELS.md).
    args.tok_dir = k3_hub::store::resolve_model(&args.tok_dir)?;
    let tok = Tokenizer::from_dir(&args.tok_dir).map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(path) = &args.export {
        let json = tok
            .export_json(true)
            .map_err(|e| CliError::runtime(e.to_string()))?;
        std::fs::write(path, json)
            .map_err(|e| CliError::runtime(format!("{}: {e}", path.display())))?;
        eprintln!("wrote {}", path.display());
        return Ok(());
    }
    if let Some(list) = &args.decode {
        let ids = parse_ids(list).map_err(|e| CliError::usage(e.replace("--ids", "--decode")))?;
        if args.show_tokens {
            return show_tokens(&tok, &ids, args.json);
        }
        let bytes = tok
            .decode(&ids)
            .map_err(|e| CliError::usage(e.to_string()))?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "ids": ids, "text": String::from_utf8_lossy(&bytes) })
            );
        } else {
            // On a terminal, control characters would be obeyed: show them escaped.
            let mut out = std::io::stdout();
            let shown = match out.is_terminal() {
                true => escape_bytes(&bytes, Style::Text).into_bytes(),
                false => bytes,
            };
            out.write_all(&shown)
                .map_err(|e| CliError::runtime(e.to_string()))?;
            println!();
        }
        return Ok(());
    }
    let ids = match (&args.text, &args.file) {
        (Some(t), _) => tok.encode(t, args.allow_special),
        (None, Some(p)) => tok.encode_bytes(&read_file(p)?, args.allow_special),
        (None, None) => return Err(CliError::usage("give --text, --file, --decode or --export")),
    };
    if args.show_tokens {
        return show_tokens(&tok, &ids, args.json);
    }
    if args.json {
        println!("{}", serde_json::json!({ "ids": ids, "count": ids.len() }));
    } else {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", s.join(","));
    }
    Ok(())
}
