//! Ctrl-C during `k3 run`: the first press stops the generation at the next token boundary
//! (a prefill in progress finishes first), and the run still writes its summary, `--json`
//! and `--save-session`, then exits 130 (the shell's code for SIGINT); a second press exits
//! 130 at once.

use crate::CliError;
use std::sync::atomic::{AtomicBool, Ordering};

/// Exit code after an interrupt (128 + SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Installs the handler.
pub fn install() -> Result<(), CliError> {
    ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            std::process::exit(i32::from(EXIT_INTERRUPTED));
        }
        eprint!("\nk3: interrupted: stopping at the next token (Ctrl-C again quits at once)\n");
    })
    .map_err(|e| CliError::runtime(format!("cannot install the Ctrl-C handler: {e}")))
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The run's outcome once its reports are written: exit 130 after an interrupt.
pub fn result(generated: usize) -> Result<(), CliError> {
    match requested() {
        false => Ok(()),
        true => Err(CliError {
            code: EXIT_INTERRUPTED,
            message: format!(
                "interrupted (Ctrl-C) after {generated} generated tokens; the summary and reports above are complete"
            ),
        }),
    }
}
