"""The oracle for tokenizers read from a GGUF file's metadata: the vocabulary as the `gguf`
package reads it, and what transformers' tokenizer built from the same file (its GGUF
converters) makes of a corpus, plus the chat template rendered by apply_chat_template.

    python3 gguf_tokenizer_oracle.py [--write-spm] FILE.gguf CORPUS.json OUT.json

CORPUS.json: {"texts": [...], "messages": [...]} ("messages" optional: the chat is rendered
only where it is given). --write-spm first writes FILE.gguf: a tiny SentencePiece BPE
vocabulary (tokenizer.ggml.model "llama": tokens, scores, token types, byte tokens <0xNN>,
and no merges, as llama.cpp's converter writes Llama 2's, Mistral's and TinyLlama's files),
trained here on a fixed text, so that transformers builds the merges from the scores.
Nothing is downloaded."""
import json
import os
import random
import sys

# transformers shows a tqdm bar while it builds merges from scores; tqdm reads this when
# transformers imports it.
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf  # noqa: E402
from bpe_training import train_merges  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

# What the --write-spm vocabulary is trained on: words, digits and punctuation, and accents
# (two-byte characters, so that pieces split between characters, not bytes).
TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away. "
    "In 2024 and 2025 there were 1234 foxes and 567 dogs, 12 of them brown. "
    "Hello world! Hello there, world. Say hello to the world again and again. "
    "She said: it's the end, isn't it? We'll see what they've done. "
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 caf\u00e9s - accents too. (hello) [world] {fox} "
)


def write_spm(path):
    """<unk> <s> </s>, the 256 byte tokens (score 0, as llama.cpp writes them), the text's
    characters (below every merged piece), then the merged pieces, in a shuffled order, so
    that merges that followed the ids rather than the scores would be caught. A merged
    piece scores minus half its merge rank, so that pieces tie in pairs; and "ic" and "ui"
    tie above all, so that "quick" shows which of two tied merges goes first (the one
    listed first). No tokenizer.ggml.merges."""
    sp = "\u2581"
    words = [sp + w for w in TRAINING_TEXT.split(" ") if w]
    chars = sorted({c for w in words for c in w})
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for i, c in enumerate(chars):
        tokens.append(c)
        types.append(1)
        scores.append(-1e4 - i)
    merged = {}
    for rank, (a, b) in enumerate(train_merges(words, 120)):
        merged.setdefault(a + b, -float(rank // 2))
    pieces = list(merged.items())
    random.Random(7).shuffle(pieces)
    pieces += [("ic", 1.0), ("ui", 1.0)]
    for piece, score in pieces:
        assert piece not in tokens, piece
        tokens.append(piece)
        types.append(1)
        scores.append(score)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("Tiny SentencePiece")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def scalar(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def main():
    args = sys.argv[1:]
    if args and args[0] == "--write-spm":
        args = args[1:]
        write_spm(args[0])
    path, corpus_path, out_path = args[:3]
    with open(corpus_path, encoding="utf-8") as f:
        corpus = json.load(f)
    r = gguf.GGUFReader(path)
    vocab = {k: scalar(r, "tokenizer.ggml." + k) for k in
             ("model", "tokens", "token_type", "merges", "scores", "bos_token_id",
              "eos_token_id", "padding_token_id", "unknown_token_id", "add_bos_token",
              "add_eos_token")}
    vocab["chat_template"] = scalar(r, "tokenizer.chat_template")
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path) or ".",
                                        gguf_file=os.path.basename(path))
    encoded = [tok.encode(t, add_special_tokens=False) for t in corpus["texts"]]
    decoded = [tok.decode(ids) for ids in encoded]
    chat = None
    if corpus.get("messages"):
        chat = tok.apply_chat_template(corpus["messages"], tokenize=False,
                                       add_generation_prompt=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"vocabulary": vocab, "encoded": encoded, "decoded": decoded, "chat": chat}, f,
                  ensure_ascii=False)


if __name__ == "__main__":
    main()
