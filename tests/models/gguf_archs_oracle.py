#!/usr/bin/env python3
"""Tiny GGUF files of each architecture Computron serves, and transformers' answers on them.

    python3 gguf_archs_oracle.py --out DIR --texts TEXTS.json --prompt TEXT --steps N

Writes, with the `gguf` package's GGUFWriter, one file per (architecture, type) below:
random weights from a fixed seed, in F32 or in Q8_0 (2-D weights quantized with
gguf.quants.quantize, 1-D norms and biases kept in F32, as llama.cpp's converter does), and
each with a tokenizer in its metadata (tokenizer.ggml.*) trained here on a fixed corpus:
byte-level BPE ("gpt2", as Qwen's files carry) or SentencePiece BPE ("llama": tokens,
scores, token types, byte tokens <0xNN>, as Llama 2's and Mistral's files carry; merges are
written too: a file without them, whose merges both sides build from the scores, is
tests/text/gguf_tokenizer_oracle.py's --write-spm). A
llama-architecture file's q and k rows go through llama.cpp's converter's permutation, so a
reader that does not undo it is caught.

Prints one JSON line once every file is written,

    {"files": [{"name": "llama-f32", "path": "...", "arch": "llama", "type": "F32",
                "tokenizer": "llama", "twin": null}, ...]}

(`twin`: for a file transformers is known to refuse, the file before it with the same
weights and metadata whose answer stands in for its own),

then one line per file, in that order, after transformers has read it
(AutoTokenizer and AutoModelForCausalLM with gguf_file=, float32):

    {"name": ..., "encoded": [[ids of each text]], "prompt": [ids of --prompt], "tokens":
     [...], "margins": [...], "logits": [...], "seconds": ...}

`encoded` without special tokens; `prompt` is the --prompt text encoded so and is what the
greedy decoding starts from (tests/models/hf_forward_oracle.py's greedy(), shared with the
folder oracle). A file transformers refuses gives {"name": ..., "refused": "the error"}
instead, and the script goes on with the next.

Never touches the network.
"""

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The BPE training the GGUF tokenizer oracle uses too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text"))
# transformers' GGUF loader shows a tqdm bar per file ("Converting and de-quantizing GGUF
# tensors"); tqdm reads this before the import below brings transformers in.
os.environ.setdefault("TQDM_DISABLE", "1")
import hf_forward_oracle  # noqa: E402  (sets HF_HUB_OFFLINE before transformers is imported)

import gguf  # noqa: E402
from bpe_training import train_merges  # noqa: E402
import numpy as np  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

Q = gguf.GGMLQuantizationType

# What the tokenizers are trained on: words, digits runs and punctuation, so that merges
# across digits and after punctuation exist (Qwen's pre-tokenizer splits digits one by one
# and keeps punctuation before a word; GPT-2's does neither).
CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away. "
    "In 2024 and 2025 there were 1234 foxes and 567 dogs, 12 of them brown. "
    "Hello world! Hello there, world. Say hello to the world again and again. "
    "She said: it's the end, isn't it? We'll see what they've done. "
    "Numbers like 3.14 and 2.71 are constants; 100 + 200 = 300. "
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 - accents too. (hello) [world] {fox} "
)

# The architectures and what each carries; each is written as F32 and as Q8_0.
#   tied: no output.weight (the embedding is the head); bias: q/k/v biases (Qwen2);
#   qk_norm: per-head RMSNorm of q and k (Qwen3); head_dim: declared with key_length when
#   not hidden/heads.
ARCHS = [
    dict(arch="llama", name="Tiny Llama", tok="llama", tied=False, bias=False, qk_norm=False,
         head_dim=None, seed=1),
    dict(arch="qwen2", name="Tiny Qwen2", tok="gpt2", tied=True, bias=True, qk_norm=False,
         head_dim=None, seed=2),
    # transformers 5.17 reads no head_dim for qwen3 (qwen3.attention.key_length is not in its
    # GGUF config mapping), so it keeps Qwen3Config's default of 128: a file of head_dim 16
    # fails in its forward ("RuntimeError: shape '[1, 2, -1, 128]' is invalid"). 128 with
    # hidden 64 also has our reader take key_length rather than hidden/heads.
    dict(arch="qwen3", name="Tiny Qwen3", tok="gpt2", tied=False, bias=False, qk_norm=True,
         head_dim=128, seed=3, theta=1000000.0),
    # Mistral 7B's files are llama-architecture files whose general.name says Mistral
    # (llama.cpp's converter writes no "mistral" architecture). transformers reads them as
    # Llama: it takes a file for Mistral only when general.name is exactly "mistral" (it
    # tests membership in the list read_field returns), and then refuses it, as it refuses
    # general.architecture "mistral" (next), because gguf-py 0.19 has no "mistral"
    # architecture (NotImplementedError: Unknown gguf model_type: mistral) and no GGUF
    # tokenizer converter is registered for it (KeyError: 'mistral').
    dict(arch="llama", name="Tiny Mistral", tok="llama", tied=False, bias=False, qk_norm=False,
         head_dim=None, seed=4, label="mistral", theta=1000000.0),
    # general.architecture "mistral", which our reader takes as llama: the same weights and
    # metadata as the file above (`twin`), whose transformers answer it must then equal.
    dict(arch="mistral", name="Tiny Mistral", tok="llama", tied=False, bias=False,
         qk_norm=False, head_dim=None, seed=4, label="mistral-arch", theta=1000000.0,
         twin="mistral"),
]
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
TYPES = [("f32", Q.F32), ("q8_0", Q.Q8_0)]


# ---- tokenizers -------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte-to-character table (printable bytes as themselves, the rest shifted)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def gpt2_vocabulary():
    """Byte-level BPE: the 256 byte characters, merges, then Qwen's three control tokens."""
    table = bytes_to_unicode()
    words = re.findall(r" ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", CORPUS)
    words = ["".join(table[b] for b in w.encode("utf-8")) for w in words]
    merges = train_merges(words, 80)
    tokens = [table[b] for b in range(256)]
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    eos = tokens.index("<|endoftext|>")
    return dict(model="gpt2", pre="qwen2", tokens=tokens, types=types,
                merges=[a + " " + b for a, b in merges], scores=None, bos=None, eos=eos,
                unk=None)


def llama_vocabulary():
    """SentencePiece BPE: <unk> <s> </s>, the 256 byte tokens, the corpus's characters, then
    merged pieces; a piece's score is minus its merge rank, as SentencePiece's BPE gives."""
    sp = "\u2581"
    words = [sp + w for w in CORPUS.split(" ") if w]
    chars = sorted({c for w in words for c in w})
    merges = train_merges(words, 80)
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for i, c in enumerate(chars):
        tokens.append(c)
        types.append(1)
        scores.append(-1e4 - i)  # characters below every merge, as SentencePiece scores them
    for rank, (a, b) in enumerate(merges):
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
            scores.append(-float(rank))
    return dict(model="llama", pre=None, tokens=tokens, types=types,
                merges=[a + " " + b for a, b in merges], scores=scores, bos=1, eos=2, unk=0)


# ---- weights ----------------------------------------------------------------------------

def permute(w, heads):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: within each head, Hugging Face
    row j * hd/2 + i becomes row 2i + j (its rotary pairs interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_file(path, spec, qtype, vocab):
    rng = np.random.default_rng(spec["seed"])
    hd = spec["head_dim"] or HIDDEN // HEADS
    n_vocab = len(vocab["tokens"])
    w = gguf.GGUFWriter(path, spec["arch"])
    arch = spec["arch"]
    w.add_name(spec["name"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == Q.F32 else
                    gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(spec.get("theta", 10000.0))
    w.add_layer_norm_rms_eps(1e-6)
    if arch in ("llama", "mistral"):
        w.add_vocab_size(n_vocab)
        w.add_rope_dimension_count(hd)
    if spec["head_dim"]:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_tokenizer_model(vocab["model"])
    if vocab["pre"]:  # llama.cpp names the pre-tokenizer of BPE vocabularies only
        w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if vocab["scores"] is not None:
        w.add_token_scores(vocab["scores"])
    w.add_token_merges(vocab["merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                     ("unk", w.add_unk_token_id)):
        if vocab[key] is not None:
            add(vocab[key])
    w.add_add_bos_token(False)

    def tensor(name, shape, scale, offset=0.0):
        data = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        if name.endswith((".attn_q.weight", ".attn_k.weight")) and arch in ("llama", "mistral"):
            data = permute(data, HEADS if ".attn_q." in name else KV_HEADS)
        # 2-D weights quantized; 1-D norms and biases stay F32, as llama.cpp's converter
        # keeps them.
        if qtype != Q.F32 and data.ndim == 2:
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, data)

    # A tied head's logits are the embedding's own rows against the last state: smaller
    # rows keep one token from winning every step.
    tensor("token_embd.weight", (n_vocab, HIDDEN), 0.25 if spec["tied"] else 1.0)
    for i in range(LAYERS):
        b = f"blk.{i}."
        tensor(b + "attn_norm.weight", (HIDDEN,), 0.1, 1.0)
        tensor(b + "attn_q.weight", (HEADS * hd, HIDDEN), HIDDEN ** -0.5)
        tensor(b + "attn_k.weight", (KV_HEADS * hd, HIDDEN), HIDDEN ** -0.5)
        tensor(b + "attn_v.weight", (KV_HEADS * hd, HIDDEN), HIDDEN ** -0.5)
        if spec["bias"]:
            tensor(b + "attn_q.bias", (HEADS * hd,), 0.5)
            tensor(b + "attn_k.bias", (KV_HEADS * hd,), 0.5)
            tensor(b + "attn_v.bias", (KV_HEADS * hd,), 0.5)
        if spec["qk_norm"]:
            tensor(b + "attn_q_norm.weight", (hd,), 0.1, 1.0)
            tensor(b + "attn_k_norm.weight", (hd,), 0.1, 1.0)
        tensor(b + "attn_output.weight", (HIDDEN, HEADS * hd), (HEADS * hd) ** -0.5)
        tensor(b + "ffn_norm.weight", (HIDDEN,), 0.1, 1.0)
        tensor(b + "ffn_gate.weight", (FFN, HIDDEN), HIDDEN ** -0.5)
        tensor(b + "ffn_up.weight", (FFN, HIDDEN), HIDDEN ** -0.5)
        tensor(b + "ffn_down.weight", (HIDDEN, FFN), FFN ** -0.5)
    tensor("output_norm.weight", (HIDDEN,), 0.1, 1.0)
    if not spec["tied"]:
        tensor("output.weight", (n_vocab, HIDDEN), HIDDEN ** -0.5 * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- transformers -----------------------------------------------------------------------

def answer(f, texts, prompt_text, steps):
    started = time.monotonic()
    where, name = os.path.dirname(f["path"]), os.path.basename(f["path"])
    try:
        tok = AutoTokenizer.from_pretrained(where, gguf_file=name, local_files_only=True)
        encoded = [tok.encode(t, add_special_tokens=False) for t in texts]
        prompt = tok.encode(prompt_text, add_special_tokens=False)
        result = json.loads(hf_forward_oracle.greedy(f["path"], prompt, steps))
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the refusal is the answer)
        msg = f"{type(e).__name__}: {e}".splitlines()
        return json.dumps({"name": f["name"], "refused": " ".join(msg)[:500]})
    logits = result.pop("logits")
    result.update(name=f["name"], encoded=encoded, prompt=prompt,
                  seconds=round(time.monotonic() - started, 3))
    return json.dumps(result)[:-1] + ', "logits": [' + \
        ",".join(format(x, ".9g") for x in logits) + "]}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the folder the files are written to")
    p.add_argument("--texts", required=True, help="a JSON list of texts to encode")
    p.add_argument("--prompt", required=True, help="the text greedy decoding starts from")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--only", default="", help="comma-separated names (llama-f32, ...) to write")
    a = p.parse_args()
    with open(a.texts, encoding="utf-8") as fh:
        texts = json.load(fh)
    import torch
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    vocabs = {"gpt2": gpt2_vocabulary(), "llama": llama_vocabulary()}
    only = {x for x in a.only.split(",") if x}
    files = []
    os.makedirs(a.out, exist_ok=True)
    for spec in ARCHS:
        for suffix, qtype in TYPES:
            name = f"{spec.get('label', spec['arch'])}-{suffix}"
            if only and name not in only:
                continue
            path = os.path.join(a.out, name + ".gguf")
            write_file(path, spec, qtype, vocabs[spec["tok"]])
            twin = f"{spec['twin']}-{suffix}" if "twin" in spec else None
            files.append(dict(name=name, path=path, arch=spec["arch"], type=qtype.name,
                              tokenizer=spec["tok"], twin=twin))
    print(json.dumps({"files": files}), flush=True)
    for f in files:
        print(answer(f, texts, a.prompt, a.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
