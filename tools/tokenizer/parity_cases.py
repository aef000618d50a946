"""Parity cases for k3-tokenizer: texts whose token ids Python tiktoken computes (the oracle)
and the Rust tests check. Each case is (name, text). Byte cases (invalid UTF-8) are separate."""

SPECIAL_LITERALS = [
    ("special_im_end_in_text", "Tell me what <|im_end|> means."),
    ("special_chat_controls", "<|open|>message role=\"user\"<|sep|>hi there<|close|>message<|sep|><|end_of_msg|>"),
    ("special_bos_eos_brackets", "[BOS]Hello[EOS] [EOT][UNK][PAD]"),
    ("special_adjacent", "<|im_user|><|im_middle|><|im_assistant|><|im_system|>"),
    ("special_partial", "<|open| <|open|> <|close <|sep|>|> <||>"),
    ("special_reserved_literal", "x<|reserved_token_200100|>y <|reserved_token_200253|>"),
    ("special_nested_angle", "<<|sep|>> <|<|open|>|>"),
]

TEXT_CASES = [
    ("empty", ""),
    ("ascii_sentence", "Hello, world! This is a simple test of the tokenizer."),
    ("han", "中文English混合。你好，世界！人工智能正在改变我们的生活方式。"),
    ("han_numbers", "〇一二三 第3章 2024年12月31日 〡〢〣"),
    ("japanese", "日本語のテキストです。カタカナとひらがな、そして漢字を混ぜます。ｶﾀｶﾅ"),
    ("korean", "한국어 텍스트입니다. 안녕하세요! ㄱㄴㄷ ᄀᄁᄂ"),
    ("cyrillic", "Привет, мир! Съешь же ещё этих мягких французских булок. ЁЛКА"),
    ("arabic", "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣٤٥ وتشكيل: مُحَمَّد"),
    ("devanagari", "नमस्ते दुनिया। हिन्दी पाठ में मात्राएँ और संयुक्ताक्षर: क्ष त्र ज्ञ ०१२"),
    ("thai", "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ ๑๒๓"),
    ("greek_hebrew", "Καλημέρα κόσμε ΑΒΓ שלום עולם"),
    ("emoji_zwj", "Family: 👨‍👩‍👧‍👦 and 🏳️‍🌈 and 👩🏽‍💻 coding"),
    ("emoji_skin_tones", "👍🏻👍🏼👍🏽👍🏾👍🏿 wave👋🏿 flags 🇯🇵🇺🇸 keycap 1️⃣ #️⃣"),
    ("combining_accents", "e\u0301cole cafe\u0301 n\u0303 Z\u0335\u0321a\u0338l\u0334g\u0337o \u0301start"),
    ("precomposed_accents", "École café naïve façade Ångström Øre Œuvre"),
    ("contractions_mixed", "I'm you're HE'S they'VE we'LL she'd It'S DON'T y'all o'clock 'tis"),
    ("contractions_edge", "'s 's 'S abc'ſ ABC'Ll x're'VE 'd'd"),
    ("long_digits", "1234567890123456789012345678901234567890 3.14159265358979 1,000,000"),
    ("other_digits", "١٢٣ ０１２３４ ²³ ½ Ⅻ ⅷ ①②③ 𝟘𝟙𝟚"),
    ("whitespace_runs", "a  b   c    d\t\te \t \tf   \n\n  g"),
    ("crlf_lines", "line one\r\nline two\r\n\r\n  indented\r\n\ttabbed\r\nend"),
    ("trailing_spaces", "trailing   \nspaces   \t\n   "),
    ("only_newlines", "\n\n\n\r\n\r\r\n"),
    ("unicode_spaces", "a\u00a0b\u2003c\u3000d\u2028e\u2029f\u0085g\u000bh\u000ci"),
    ("leading_spaces_words", "   leading and  double  spaces before words   end"),
    ("python_code", "def f(x: int) -> int:\n    \"\"\"Doc.\"\"\"\n    if x <= 1:\n        return 1\n    return x * f(x - 1)  # recurse\n"),
    ("rust_code", "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n"),
    ("json_blob", "{\"name\": \"k3\", \"vocab\": 163840, \"ok\": true, \"list\": [1, 2.5, null], \"nested\": {\"a\": \"\\u00e9\"}}"),
    ("html", "<!DOCTYPE html>\n<html lang=\"en\"><head><title>Test &amp; more</title></head>\n<body><p class='x'>Hi</p></body></html>"),
    ("urls", "See https://example.com/path/to/page?query=1&lang=en#frag and http://foo.bar:8080/a_b-c.d~e"),
    ("base64_blob", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="),
    ("markdown", "# Title\n\n- item **bold** _it_ `code`\n> quote\n\n| a | b |\n|---|---|\n"),
    ("punctuation_runs", "Wait... what?!?! --- *** ((()))  [[x]] {{y}} <<z>> ¿¡Qué!? «quote» “smart” ‘single’"),
    ("math_symbols", "∀x∈ℝ: x²≥0 ⇒ √x ∈ ℝ⁺ ∑_{i=1}^{n} i = n(n+1)/2 ≈ ∞ ≠ ±"),
    ("mixed_scripts", "English中文日本語한국어Русскийالعربيةहिन्दीไทย123"),
    ("camel_snake", "camelCaseIdentifier snake_case_name SCREAMING_CASE XMLHttpRequest iPhone eBay"),
    ("control_chars", "nul\u0000bel\u0007esc\u001b[31mred\u001b[0m del\u007f"),
    ("zero_width", "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom"),
    ("han_punct_fullwidth", "你好，世界。「引用」（括号）【标题】《书名》、顿号"),
    ("surrogate_plane", "𠀀𠀁 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀𓀁 🀄 🧑‍🤝‍🧑"),
    ("long_letter_run", "a" * 300 + " " + "xyzzy" * 60),
    ("long_symbol_run", "=" * 120 + "\n" + "-+" * 80),
    ("lone_mark_and_spaces", "\u0301\u0302 \u0303x \t\u0304"),
    ("kelvin_long_s", "\u212a \u017f 'ſ 'K Straße STRASSE ﬁ ﬀ"),
]


def byte_cases():
    """(name, bytes) cases with invalid UTF-8 (and one valid control case)."""
    return [
        ("bytes_lone_ff", b"abc\xffdef"),
        ("bytes_truncated_han", "中文".encode()[:-1] + b" tail"),
        ("bytes_many_invalid", b"\x80\x81\xfe\xff plain \xc3( \xed\xa0\x80 surrogate"),
        ("bytes_invalid_at_end", b"ends with \xe4\xb8"),
        ("bytes_special_then_invalid", b"<|im_end|>\xff<|open|>ok"),
        ("bytes_valid_control", "plain valid ünïcödé".encode()),
    ]
