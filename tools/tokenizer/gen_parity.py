#!/usr/bin/env python3
"""Generates k3-tokenizer's parity expectations with Python tiktoken (the oracle).

Writes JSON files under crates/k3-tokenizer/tests/data/ that the Rust tests read (no Python at
test time):
  parity_o200k.json      o200k_base ranks + Kimi pat_str + Kimi special layout (tests/data/o200k_kimi)
  parity_tiny_k3.json    fixtures/tiny-k3 tokenizer
  parity_tiny_k3_wide.json fixtures/tiny-k3-wide tokenizer

Usage (from the repo root):  python3 tools/tokenizer/gen_parity.py
Needs: tiktoken (pip), tools/reference/kimi_pat.py, the fixture directories.
"""
import base64
import hashlib
import json
import os
import re
import sys

import tiktoken

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, HERE)

from kimi_pat import PAT_STR  # noqa: E402
from parity_cases import SPECIAL_LITERALS, TEXT_CASES, byte_cases  # noqa: E402

DATA = os.path.join(ROOT, "crates", "k3-tokenizer", "tests", "data")
NUM_SPECIAL_SLOTS = 256
CORPUS_MIN_BYTES = 256 * 1024

# Special names by offset after the ranks (the tiny fixtures' layout, Kimi heritage).
SPECIAL_NAMES = ["[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>",
                 "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                 "<|im_middle|>", "[EOT]", "[UNK]", "[PAD]"]


def load_ranks(path):
    """tiktoken.model -> {bytes: rank}, strict like the Rust loader."""
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line.strip():
                token, rank = line.split(b" ")
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    return ranks


def kimi_encoding(model_path, config_path):
    """Kimi's construction (tokenization_kimi.py): 256 slots after the ranks, unlisted slots
    named <|reserved_token_{id}|>."""
    ranks = load_ranks(model_path)
    with open(config_path) as f:
        config = json.load(f)
    named = {int(k): v["content"] for k, v in config.get("added_tokens_decoder", {}).items()}
    n = len(ranks)
    specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + NUM_SPECIAL_SLOTS)}
    enc = tiktoken.Encoding(name="k3-parity", pat_str=PAT_STR, mergeable_ranks=ranks,
                            special_tokens=specials)
    return enc, specials


def encode_bytes_rule(enc, specials, data, allow_specials):
    """The Rust crate's documented rule for raw bytes: added tokens first (when allowed), then
    valid UTF-8 runs via encode_ordinary and each maximal invalid run as one raw BPE piece."""
    out = []
    rest = data
    contents = sorted(((c.encode(), i) for c, i in specials.items()), key=lambda x: -len(x[0]))
    while allow_specials:
        best = None
        for content, tid in contents:  # longest first, so the first hit at a start wins
            at = rest.find(content)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, len(content), tid)
        if best is None:
            break
        out += ordinary_bytes(enc, rest[:best[0]])
        out.append(best[2])
        rest = rest[best[0] + best[1]:]
    return out + ordinary_bytes(enc, rest)


def ordinary_bytes(enc, data):
    """surrogateescape marks exactly the bytes that are not part of valid UTF-8."""
    text = data.decode("utf-8", errors="surrogateescape")
    out = []
    for run in re.findall("[\udc80-\udcff]+|[^\udc80-\udcff]+", text):
        if "\udc80" <= run[0] <= "\udcff":
            out += enc._encode_single_piece(run.encode("utf-8", errors="surrogateescape"))
        else:
            out += enc.encode_ordinary(run)
    return out


def fnv1a_ids(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def corpus(texts, min_bytes):
    """Deterministic mixed-script corpus (the Rust tests rebuild it the same way)."""
    x, parts, size = 0x9E3779B97F4A7C15, [], 0
    texts = [t for t in texts if t]
    while size < min_bytes:
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        t = texts[(x >> 33) % len(texts)] + "\n"
        parts.append(t)
        size += len(t.encode())
    return "".join(parts)


def build(name, model_path, config_path, source):
    enc, specials = kimi_encoding(model_path, config_path)
    cases = []
    for case_name, text in TEXT_CASES + SPECIAL_LITERALS:
        cases.append({
            "name": case_name,
            "text": text,
            "ordinary": enc.encode(text, disallowed_special=()),
            "with_specials": enc.encode(text, allowed_special="all"),
        })
        assert enc.decode_bytes(cases[-1]["ordinary"]) == text.encode()
    bcases = []
    for case_name, data in byte_cases():
        ordinary = encode_bytes_rule(enc, specials, data, False)
        assert enc.decode_bytes(ordinary) == data
        bcases.append({
            "name": case_name,
            "hex": data.hex(),
            "ordinary": ordinary,
            "with_specials": encode_bytes_rule(enc, specials, data, True),
        })
    big = corpus([t for _, t in TEXT_CASES], CORPUS_MIN_BYTES)
    big_ids = enc.encode_ordinary(big)
    doc = {
        "generator": "tools/tokenizer/gen_parity.py (tiktoken %s)" % tiktoken.__version__,
        "source": source,
        "n_ranks": enc.n_vocab - NUM_SPECIAL_SLOTS,
        "cases": cases,
        "byte_cases": bcases,
        "corpus": {"min_bytes": CORPUS_MIN_BYTES, "bytes": len(big.encode()),
                   "n_ids": len(big_ids), "fnv1a64": "%016x" % fnv1a_ids(big_ids)},
    }
    out = os.path.join(DATA, name)
    with open(out, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{out}: {len(cases)} text cases, {len(bcases)} byte cases, corpus "
          f"{doc['corpus']['bytes']} B -> {len(big_ids)} ids")


def write_o200k_config(path, n_ranks):
    """Kimi layout for o200k: the named specials, other slots left unlisted (reserved)."""
    added = {str(n_ranks + i): {"content": c, "lstrip": False, "normalized": False,
                                "rstrip": False, "single_word": False, "special": True}
             for i, c in enumerate(SPECIAL_NAMES)}
    config = {"added_tokens_decoder": added, "bos_token": "[BOS]",
              "eos_token": {"content": "[EOS]", "special": True},
              "tokenizer_class": "TikTokenTokenizer"}
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def main():
    o200k_dir = os.path.join(DATA, "o200k_kimi")
    model = os.path.join(o200k_dir, "o200k_base.tiktoken")
    digest = hashlib.sha256(open(model, "rb").read()).hexdigest()
    config = os.path.join(o200k_dir, "tokenizer_config.json")
    write_o200k_config(config, len(load_ranks(model)))
    build("parity_o200k.json", model, config, f"o200k_base.tiktoken sha256 {digest}")
    for fixture in ["tiny-k3", "tiny-k3-wide"]:
        d = os.path.join(ROOT, "fixtures", fixture)
        if os.path.exists(os.path.join(d, "tiktoken.model")):
            build("parity_%s.json" % fixture.replace("-", "_"), os.path.join(d, "tiktoken.model"),
                  os.path.join(d, "tokenizer_config.json"), f"fixtures/{fixture}")


if __name__ == "__main__":
    main()
