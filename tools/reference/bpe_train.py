"""Deterministic byte-level BPE trainer producing tiktoken rank tables (docs/MODEL.md#tokenizer).

Ranks 0..255 are the single bytes (rank = byte value); each further rank is the merge of the
most frequent adjacent pair inside the pre-tokenized chunks (Kimi pat_str), ties broken by the
lowest (rank_left, rank_right). tiktoken's rank-BPE then merges by lowest rank of the
concatenated bytes, so training order = merge priority.
"""
import base64
from collections import Counter

from kimi_pat import compile_pat

# the 256 added tokens directly after the ranks (offsets 0..13 named, then reserved)
NAMED_SPECIALS = ["[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>",
                  "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                  "<|im_middle|>", "[EOT]", "[UNK]", "[PAD]"]
N_SPECIALS = 256


def special_names():
    return NAMED_SPECIALS + [f"<|reserved_token_{i}|>" for i in range(len(NAMED_SPECIALS), N_SPECIALS)]


def train_bpe(text, n_ranks):
    """-> dict bytes -> rank with exactly n_ranks entries."""
    pat = compile_pat()
    chunk_freq = Counter(m.encode("utf-8") for m in pat.findall(text))
    ranks = {bytes([i]): i for i in range(256)}
    # each distinct chunk as a list of token byte-strings, with its frequency
    words = [([bytes([b]) for b in chunk], f) for chunk, f in sorted(chunk_freq.items())]
    while len(ranks) < n_ranks:
        pairs = Counter()
        for toks, f in words:
            for a, b in zip(toks, toks[1:]):
                pairs[(a, b)] += f
        if not pairs:
            raise RuntimeError(f"corpus too small: only {len(ranks)} ranks possible")
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], ranks[kv[0][0]], ranks[kv[0][1]]))
        merged = a + b
        if merged not in ranks:
            ranks[merged] = len(ranks)
        for toks, _ in words:  # apply the merge left to right
            i = 0
            while i < len(toks) - 1:
                if toks[i] == a and toks[i + 1] == b:
                    toks[i:i + 2] = [merged]
                i += 1
    return ranks


def tiktoken_model_text(ranks):
    """tiktoken.model body: `base64(token bytes) rank` per line, rank order."""
    return "".join(f"{base64.b64encode(tok).decode()} {r}\n"
                   for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def tokenizer_config(n_ranks, model_max_length):
    dec = {}
    for off, name in enumerate(special_names()):
        dec[str(n_ranks + off)] = {"content": name, "lstrip": False, "normalized": False,
                                   "rstrip": False, "single_word": False, "special": True}
    return {"added_tokens_decoder": dec, "bos_token": "[BOS]", "eos_token": "[EOS]",
            "model_max_length": model_max_length, "tokenizer_class": "TikTokenTokenizer"}


def make_encoding(name, ranks):
    """a tiktoken.Encoding over the ranks + the 256 specials (proves the files load)."""
    import tiktoken
    from kimi_pat import PAT_STR
    n = len(ranks)
    specials = {s: n + i for i, s in enumerate(special_names())}
    return tiktoken.Encoding(name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)


def load_tiktoken_model(path):
    ranks = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\r\n")
            if not line:
                continue
            b64, r = line.split(" ")
            ranks[base64.b64decode(b64)] = int(r)
    return ranks
