//! What `k3 run` writes while and after it generates. stdout carries the product and nothing
//! else: the generated text (control characters escaped when stdout is a terminal), or, for a
//! model without a tokenizer, the generated ids as `1,2,3`; one newline ends it. Everything
//! else goes to stderr: `--print-ids`, the per-token lines of `-v`, the summary and the I/O
//! report.

use k3_engine::{Engine, StoreStats};
use k3_tokenizer::escape::{escape_str, Style};
use std::io::{IsTerminal, Stdout, Write};
use std::time::Instant;

/// The generated text (or ids) on stdout, as it decodes.
pub struct TextOut {
    out: Stdout,
    /// stdout is a terminal: escape control characters.
    tty: bool,
    /// Ids written so far (ids-only output puts commas between them).
    ids: usize,
    /// Write nothing (`--json -` puts the report on stdout instead).
    silent: bool,
}

impl TextOut {
    pub fn new(silent: bool) -> TextOut {
        let out = std::io::stdout();
        let tty = out.is_terminal();
        TextOut {
            out,
            tty,
            ids: 0,
            silent,
        }
    }

    /// Writes a piece of decoded text.
    pub fn text(&mut self, piece: &str) {
        if piece.is_empty() || self.silent {
            return;
        }
        let shown = if self.tty {
            escape_str(piece, Style::Text)
        } else {
            piece.into()
        };
        let _ = self.out.write_all(shown.as_bytes());
        let _ = self.out.flush();
    }

    /// Writes one id of an ids-only generation.
    pub fn id(&mut self, id: u32) {
        if self.silent {
            return;
        }
        let sep = if self.ids == 0 { "" } else { "," };
        let _ = write!(self.out, "{sep}{id}");
        let _ = self.out.flush();
        self.ids += 1;
    }

    /// Ends the output with one newline.
    pub fn finish(&mut self) {
        if self.silent {
            return;
        }
        let _ = writeln!(self.out);
        let _ = self.out.flush();
    }
}

/// The per-token lines of `-v` on stderr: written as each token comes, except when stdout and
/// stderr are both terminals (where they would interleave with the text): then they are held
/// and written after the text.
pub struct LiveLines {
    on: bool,
    hold: bool,
    held: Vec<String>,
    streaming: bool,
    step: usize,
    last_t: Instant,
    last_stats: StoreStats,
}

impl LiveLines {
    pub fn new(on: bool, engine: &Engine) -> LiveLines {
        LiveLines {
            on,
            hold: std::io::stdout().is_terminal() && std::io::stderr().is_terminal(),
            held: Vec::new(),
            streaming: engine.plan().is_some(),
            step: 0,
            last_t: Instant::now(),
            last_stats: engine.stats(),
        }
    }

    /// Records token `id`, just generated.
    pub fn token(&mut self, id: u32, engine: &Engine) {
        if !self.on {
            return;
        }
        let secs = self.last_t.elapsed().as_secs_f64();
        let mut line = format!("step {:>4}  token {id:>7}  {secs:>8.3} s", self.step);
        if self.streaming {
            let now = engine.stats();
            let d = now.since(&self.last_stats);
            line.push_str(&format!(
                "  read {:>9.3} GB  expert hits {:>5.1}%  trunk hits {:>5.1}%",
                d.bytes_read() as f64 / 1e9,
                100.0 * d.expert_hit_rate(),
                100.0 * d.trunk_hit_rate(),
            ));
            self.last_stats = now;
        }
        if self.hold {
            self.held.push(line);
        } else {
            eprintln!("{line}");
        }
        self.step += 1;
        self.last_t = Instant::now();
    }

    /// Writes the held lines (after the text has ended).
    pub fn flush(&mut self) {
        for line in self.held.drain(..) {
            eprintln!("{line}");
        }
    }
}
