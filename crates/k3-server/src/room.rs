//! How many tokens a request may generate: an explicit `max_tokens` must fit the context
//! beside the prompt (docs/SERVER.md "Limits"), as `k3 run -n` must; without one the default
//! is clamped to the room left.

use k3_api::ApiError;

/// New tokens at most for a prompt of `prompt` tokens in a context of `ctx` (the prompt
/// already leaves room): `max_tokens` when it fits, else a 400 naming `max_tokens`, the
/// context and the prompt length; without it, `default` clamped to the room.
pub fn max_new(
    prompt: usize,
    ctx: usize,
    max_tokens: Option<usize>,
    default: usize,
) -> Result<usize, ApiError> {
    let room = ctx.saturating_sub(prompt);
    let Some(asked) = max_tokens else {
        return Ok(default.min(room));
    };
    if asked <= room {
        return Ok(asked);
    }
    let need = prompt.saturating_add(asked);
    Err(ApiError::invalid(
        "max_tokens",
        format!(
            "max_tokens: the maximum context length is {ctx} tokens, but {need} were requested ({prompt} in the prompt, {asked} in max_tokens): lower max_tokens to at most {room}, shorten the prompt, or restart the server with a larger --ctx"
        ),
    )
    .with_code("context_length_exceeded"))
}

#[cfg(test)]
mod tests {
    use super::max_new;

    #[test]
    fn an_explicit_max_tokens_must_fit_and_the_default_is_clamped() {
        assert_eq!(max_new(10, 64, None, 512).unwrap(), 54);
        assert_eq!(max_new(10, 64, Some(54), 512).unwrap(), 54);
        let e = max_new(10, 64, Some(1_000_000_000), 512).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(e.code, Some("context_length_exceeded"));
        for needle in [
            "64 tokens",
            "1000000010 were requested",
            "10 in the prompt",
            "at most 54",
        ] {
            assert!(e.message.contains(needle), "{needle}: {}", e.message);
        }
        assert!(max_new(10, 64, Some(55), 512).is_err());
    }
}
