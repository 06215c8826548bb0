"""The oracle for tokenizers read from a GGUF file's metadata: the vocabulary as the `gguf`
package reads it, and what transformers' tokenizer built from the same file (its GGUF
converters) makes of a corpus, plus the chat template rendered by apply_chat_template.

    python3 gguf_tokenizer_oracle.py FILE.gguf CORPUS.json OUT.json

CORPUS.json: {"texts": [...], "messages": [...]}. Nothing is downloaded."""
import json
import os
import sys

import gguf
from transformers import AutoTokenizer


def scalar(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def main():
    path, corpus_path, out_path = sys.argv[1:4]
    with open(corpus_path, encoding="utf-8") as f:
        corpus = json.load(f)
    r = gguf.GGUFReader(path)
    vocab = {k: scalar(r, "tokenizer.ggml." + k) for k in
             ("model", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id",
              "padding_token_id", "unknown_token_id", "add_bos_token", "add_eos_token")}
    vocab["chat_template"] = scalar(r, "tokenizer.chat_template")
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path) or ".",
                                        gguf_file=os.path.basename(path))
    encoded = [tok.encode(t, add_special_tokens=False) for t in corpus["texts"]]
    decoded = [tok.decode(ids) for ids in encoded]
    chat = tok.apply_chat_template(corpus["messages"], tokenize=False, add_generation_prompt=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"vocabulary": vocab, "encoded": encoded, "decoded": decoded, "chat": chat}, f,
                  ensure_ascii=False)


if __name__ == "__main__":
    main()
