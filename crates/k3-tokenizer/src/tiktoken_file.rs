//! `tiktoken.model`: one `<base64 token bytes> <rank>` per line (docs/TOKENIZER.md#tiktokenmodel-checks).

use base64::Engine as _;

use crate::bpe::Ranks;
use crate::error::{Result, TokenizerError};

/// Longest accepted base64 field in chars (docs/TOKENIZER.md#tiktokenmodel-checks, the C loader's limit; padded fields of up
/// to 510 raw bytes fit).
pub const MAX_BASE64_LEN: usize = 682;

/// Ranks must lie below this hard limit (16 Mi); larger values are surely corrupt.
pub const RANK_LIMIT: u64 = 1 << 24;

/// One parsed line: rank, token bytes as a range of the parse arena, 1-based line number.
struct Entry {
    rank: u32,
    start: u32,
    end: u32,
    line: usize,
}

/// Parses a `tiktoken.model` file body (`file` names it in errors) into the rank table.
///
/// Accepts `\n` or `\r\n` line ends and skips blank lines. Fails on a malformed line, invalid
/// base64, a field over [`MAX_BASE64_LEN`] chars, a rank at or above [`RANK_LIMIT`], duplicate
/// ranks or token bytes, ranks that are not dense `0..n`, or a missing single byte.
pub(crate) fn parse(data: &[u8], file: &str) -> Result<Ranks> {
    let mut entries = Vec::with_capacity(data.len() / 12);
    let mut arena = Vec::with_capacity(data.len() / 2);
    for (index, raw) in data.split(|&b| b == b'\n').enumerate() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        entries.push(parse_line(line, index + 1, file, &mut arena)?);
    }
    let mut offsets: Vec<u32> = Vec::with_capacity(entries.len() + 1);
    offsets.push(0);
    if entries.windows(2).all(|w| w[0].rank < w[1].rank) {
        offsets.extend(entries.iter().map(|e| e.end)); // already in rank order
    } else {
        entries.sort_by_key(|e| e.rank); // stable: equal ranks keep file order
        let mut sorted = Vec::with_capacity(arena.len());
        for e in &entries {
            sorted.extend_from_slice(&arena[e.start as usize..e.end as usize]);
            offsets.push(sorted.len() as u32);
        }
        arena = sorted;
    }
    check_dense(&entries, file)?;
    let lines: Vec<usize> = entries.iter().map(|e| e.line).collect();
    let ranks = Ranks::from_arena(arena, offsets).map_err(|(second, first)| {
        TokenizerError::DuplicateToken {
            file: file.to_string(),
            line: lines[second as usize],
            first: lines[first as usize],
        }
    })?;
    check_bytes(&ranks, file)?;
    Ok(ranks)
}

/// Parses one non-blank line, appending the decoded token bytes to `arena`.
fn parse_line(line: &[u8], number: usize, file: &str, arena: &mut Vec<u8>) -> Result<Entry> {
    let malformed = |reason: &str| TokenizerError::MalformedLine {
        file: file.to_string(),
        line: number,
        reason: reason.to_string(),
    };
    let mut fields = line.split(|&b| b == b' ');
    let (Some(token), Some(rank), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(malformed("need exactly one space between token and rank"));
    };
    if token.len() > MAX_BASE64_LEN {
        return Err(TokenizerError::Base64TooLong {
            file: file.to_string(),
            line: number,
            len: token.len(),
        });
    }
    let rank = parse_rank(rank).ok_or_else(|| malformed("rank is not a decimal integer"))?;
    if rank >= RANK_LIMIT {
        return Err(TokenizerError::RankOutOfRange {
            file: file.to_string(),
            line: number,
            rank,
            limit: RANK_LIMIT,
        });
    }
    let start = arena.len();
    base64::engine::general_purpose::STANDARD
        .decode_vec(token, arena)
        .map_err(|e| TokenizerError::Base64 {
            file: file.to_string(),
            line: number,
            field: String::from_utf8_lossy(&token[..token.len().min(40)]).into_owned(),
            reason: e.to_string(),
        })?;
    if arena.len() == start {
        return Err(malformed("empty token"));
    }
    Ok(Entry {
        rank: rank as u32,
        start: start as u32,
        end: arena.len() as u32,
        line: number,
    })
}

/// Decimal digits only (no sign, no spaces), at most 19 of them.
fn parse_rank(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 19 || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        field
            .iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0')),
    )
}

/// `entries` sorted by rank must be exactly `0..n`.
fn check_dense(entries: &[Entry], file: &str) -> Result<()> {
    for pair in entries.windows(2) {
        if pair[0].rank == pair[1].rank {
            return Err(TokenizerError::DuplicateRank {
                file: file.to_string(),
                line: pair[1].line,
                rank: pair[1].rank,
                first: pair[0].line,
            });
        }
    }
    if let Some(k) = entries
        .iter()
        .enumerate()
        .position(|(k, e)| e.rank as usize != k)
    {
        let last = &entries[entries.len() - 1];
        return Err(TokenizerError::MissingRank {
            file: file.to_string(),
            line: last.line,
            rank: k as u32,
            count: entries.len(),
            max: last.rank,
        });
    }
    Ok(())
}

fn check_bytes(ranks: &Ranks, file: &str) -> Result<()> {
    match (0..=255u8).find(|&b| ranks.rank(&[b]).is_none()) {
        Some(byte) => Err(TokenizerError::MissingByte {
            file: file.to_string(),
            byte,
        }),
        None => Ok(()),
    }
}
