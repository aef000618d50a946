//! llama.cpp's multi-letter single-dash flags, rewritten to k3's long flags before clap sees
//! the command line (clap's short flags are one character, so `-np` would read as `-n p`).
//!
//! The one place this happens (README "llama.cpp habits"): a word that is exactly one of
//! [`REWRITES`]' dashes (or `DASH=VALUE`) is replaced by its long flag, up to a bare `--`.
//! A word that is the value of a flag taking free text (`-p -sys` prompts with "-sys") is
//! left alone.

/// llama.cpp spelling → k3's long flag.
const REWRITES: [(&str, &str); 4] = [
    ("-md", "--draft-model"),
    ("-np", "--parallel"),
    ("-ub", "--ubatch"),
    ("-sys", "--system"),
];

/// Flags whose next word is free text, never rewritten.
const TEXT_FLAGS: [&str; 7] = [
    "-p",
    "--prompt",
    "--system",
    "--stop",
    "-r",
    "--reverse-prompt",
    "--text",
];

/// `args` (program name first) with llama.cpp's multi-letter dashes rewritten.
pub fn normalise(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = Vec::new();
    let mut verbatim = false;
    for arg in args {
        let prev_takes_text = out
            .last()
            .and_then(|p| p.to_str())
            .is_some_and(|p| TEXT_FLAGS.contains(&p));
        let rewritten = match arg.to_str() {
            Some("--") => {
                verbatim = true;
                None
            }
            Some(word) if !verbatim && !prev_takes_text => rewrite(word),
            _ => None,
        };
        out.push(rewritten.map_or(arg, Into::into));
    }
    out
}

/// The long form of one word, when it is a llama.cpp multi-letter dash.
fn rewrite(word: &str) -> Option<String> {
    let (flag, value) = match word.split_once('=') {
        Some((f, v)) => (f, Some(v)),
        None => (word, None),
    };
    let long = REWRITES.iter().find(|(l, _)| *l == flag)?.1;
    Some(match value {
        Some(v) => format!("{long}={v}"),
        None => long.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::normalise;

    fn norm(words: &[&str]) -> Vec<String> {
        normalise(words.iter().map(|w| (*w).into()))
            .into_iter()
            .map(|w| w.into_string().unwrap())
            .collect()
    }

    #[test]
    fn rewrites_multi_letter_dashes_only() {
        assert_eq!(
            norm(&["k3", "serve", "M", "-np", "2", "-ub=64", "-n", "4"]),
            [
                "k3",
                "serve",
                "M",
                "--parallel",
                "2",
                "--ubatch=64",
                "-n",
                "4"
            ]
        );
        assert_eq!(
            norm(&["k3", "chat", "M", "-sys", "Be brief."]),
            ["k3", "chat", "M", "--system", "Be brief."]
        );
    }

    #[test]
    fn leaves_text_values_and_words_after_double_dash() {
        assert_eq!(
            norm(&["k3", "run", "M", "-p", "-np", "-sys", "-np"]),
            ["k3", "run", "M", "-p", "-np", "--system", "-np"]
        );
        assert_eq!(
            norm(&["k3", "run", "M", "--", "-np"]),
            ["k3", "run", "M", "--", "-np"]
        );
    }
}
