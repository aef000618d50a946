"""Kimi pre-tokenizer split regex (`pat_str`), docs/MODEL.md#tokenizer -- the single source for k3's tokenizer
tools (fixture generator, parity checks). It is the published Kimi K2 string; K3 ships the same
tiktoken.model. `&&` is a character-class intersection: tiktoken (fancy-regex) understands it,
Python's `regex` module needs the V1 flag (see `compile_pat`)."""

PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def compile_pat():
    """PAT_STR compiled with the third-party `regex` module (V1 = set operations like &&)."""
    import regex
    return regex.compile(PAT_STR, flags=regex.V1)
