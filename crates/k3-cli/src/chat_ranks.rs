//! `k3 chat` over MPI ranks (docs/DISTRIBUTED.md#chat-over-ranks): rank 0 reads every input
//! line (and the file a `/load` names) and broadcasts it; every rank runs the same chat logic
//! on it, and only rank 0 prints (a follower's stdout is /dev/null). A reply's Ctrl-C reaches
//! the other ranks with rank 0's verdict on each sampled id (`k3-engine`, generate.rs), and the
//! flag itself by [`share_flag`] after the reply.

use crate::CliError;
use k3_engine::chat_template::ChatMessage;
use k3_engine::Comm;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One input as broadcast.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub enum Said {
    /// A message or a command.
    Line(String),
    /// `/load PATH`, with what rank 0 read from PATH (the messages, or the error to print).
    Load {
        line: String,
        messages: Result<Vec<ChatMessage>, String>,
    },
    /// End of input: every rank leaves.
    Eof,
}

fn distributed(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(format!("distributed: {e}"))
}

/// Rank 0's input of this turn: `mine` on rank 0 (sent to the others), received on the
/// others (whose `mine` is `None`).
pub fn share(comm: &Arc<dyn Comm>, mine: Option<Said>) -> Result<Said, CliError> {
    let mut bytes = match &mine {
        Some(said) => serde_json::to_vec(said).map_err(distributed)?,
        None => Vec::new(),
    };
    comm.broadcast_bytes(0, &mut bytes).map_err(distributed)?;
    match mine {
        Some(said) => Ok(said),
        None => serde_json::from_slice(&bytes).map_err(|e| {
            distributed(format!(
                "rank 0 sent a chat input this rank cannot read (same k3 build on every rank?): {e}"
            ))
        }),
    }
}

/// What rank 0 broadcasts for `line` it read: a `/load PATH` carries the file's messages.
pub fn said_of(line: String) -> Said {
    let path = line
        .strip_prefix('/')
        .and_then(|cmd| cmd.trim().strip_prefix("load"))
        .filter(|rest| rest.starts_with(char::is_whitespace))
        .map(str::trim)
        .filter(|p| !p.is_empty());
    match path {
        Some(p) => {
            let messages = k3_engine::chat_template::load_history(std::path::Path::new(p))
                .map_err(|e| e.to_string());
            Said::Load { line, messages }
        }
        None => Said::Line(line),
    }
}

/// Rank 0's `flag` on every rank (itself when one process).
pub fn share_flag(comm: Option<&Arc<dyn Comm>>, flag: bool) -> Result<bool, CliError> {
    let Some(comm) = comm else {
        return Ok(flag);
    };
    let mut word = vec![u32::from(flag)];
    comm.broadcast_u32(0, &mut word).map_err(distributed)?;
    Ok(word.first() == Some(&1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_engine::LocalComm;

    #[test]
    fn every_rank_gets_rank_zeros_inputs_and_flag() {
        let dir = std::env::temp_dir().join(format!("k3-chat-ranks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let transcript = dir.join("t.jsonl");
        std::fs::write(&transcript, "{\"role\":\"user\",\"content\":\"hi\"}\n").unwrap();
        let load = format!("/load {}", transcript.display());
        let inputs = [
            said_of("hello".into()),
            said_of(load.clone()),
            said_of("/load /no/such/file".into()),
            Said::Eof,
        ];
        assert!(matches!(&inputs[1], Said::Load { messages: Ok(m), .. } if m.len() == 1));
        assert!(matches!(
            &inputs[2],
            Said::Load {
                messages: Err(_),
                ..
            }
        ));
        assert_eq!(said_of("/loader".into()), Said::Line("/loader".into()));
        let comms: Vec<Arc<dyn Comm>> = (LocalComm::group(3).into_iter())
            .map(|c| Arc::new(c) as Arc<dyn Comm>)
            .collect();
        let got: Vec<(Vec<String>, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = (comms.iter().enumerate())
                .map(|(rank, comm)| {
                    let inputs = &inputs;
                    s.spawn(move || {
                        let mut seen = Vec::new();
                        for said in inputs {
                            let mine = (rank == 0).then(|| serde_json::to_string(said).unwrap());
                            let mine = mine.map(|j| serde_json::from_str(&j).unwrap());
                            seen.push(format!("{:?}", share(comm, mine).ok().unwrap()));
                        }
                        (seen, share_flag(Some(comm), rank == 0).ok().unwrap())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: Vec<String> = inputs.iter().map(|s| format!("{s:?}")).collect();
        for (rank, (seen, flag)) in got.iter().enumerate() {
            assert_eq!(seen, &want, "rank {rank}");
            assert!(flag, "rank {rank} has rank 0's flag");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
