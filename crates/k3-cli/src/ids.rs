//! Parsing `--ids 1,2,3` strictly: no wrapping, no guessing.

/// Parses a comma-separated list of token ids. Every entry must be a decimal integer in
/// `0..=u32::MAX`; the message names the offending entry and its position.
pub fn parse_ids(text: &str) -> Result<Vec<u32>, String> {
    if text.trim().is_empty() {
        return Err("--ids is empty: give comma-separated token ids, e.g. --ids 1,2,3".into());
    }
    text.split(',')
        .enumerate()
        .map(|(i, raw)| {
            let s = raw.trim();
            if s.is_empty() {
                return Err(format!("--ids entry {} is empty (stray comma?)", i + 1));
            }
            if s.starts_with('-') {
                return Err(format!(
                    "--ids entry {} is {s:?}: token ids cannot be negative",
                    i + 1
                ));
            }
            if !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "--ids entry {} is {s:?}: not a decimal token id",
                    i + 1
                ));
            }
            s.parse::<u32>().map_err(|_| {
                format!(
                    "--ids entry {} is {s}: larger than the largest possible token id {}",
                    i + 1,
                    u32::MAX
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_ids;

    #[test]
    fn accepts_plain_lists() {
        assert_eq!(parse_ids("1,2, 3").unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn refuses_everything_odd_by_name() {
        for (input, needle) in [
            ("", "empty"),
            ("1,,2", "entry 2 is empty"),
            ("1,-5", "negative"),
            ("abc", "not a decimal"),
            ("4294967301", "larger than"),
            ("1.5", "not a decimal"),
        ] {
            let err = parse_ids(input).unwrap_err();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }
}
