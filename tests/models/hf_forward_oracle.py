#!/usr/bin/env python3
"""Hugging Face transformers as an independent oracle of our forward.

Loads each local model folder (or GGUF file) with AutoModelForCausalLM in float32 with eager attention on
the CPU, decodes `--steps` tokens greedily after `--prompt`, and prints one JSON line per
folder, in the order given, as soon as that folder is done:

    {"folder": "...", "model_type": "qwen2", "transformers": "5.17.0", "torch": "2.11.0",
     "tokens": [...], "margins": [...], "seconds": 1.2, "logits": [...]}

`tokens` are the greedy tokens (the prompt not included), `margins` each step's top logit
less the runner-up (how near a tie the choice was), and `logits` the whole vocabulary row
the first token was chosen from, each value with 9 significant digits (a float32 survives
the round trip).

With `--wait`, a folder is read only once FOLDER.ready exists: the test starts this script
first (importing torch and transformers takes seconds), then writes the folders one at a
time, each while the previous one is being compared, and removes each once it has its line.
A gigabyte folder is then the most the two processes hold at once.

Greedy decoding is written out here instead of calling generate(): generate() stops at the
folder's eos token and applies whatever generation_config.json says. Each step reruns the
whole sequence without a KV cache, so the oracle shares no cache logic with the forward it
checks.

Never touches the network (HF_HUB_OFFLINE is set before transformers is imported).
"""

import argparse
import gc
import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def wait_for(path, timeout_s, parent):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        # A test killed outright never releases the rest: do not linger as an orphan.
        if os.getppid() != parent:
            raise SystemExit(f"the test that started this script is gone (waiting for {path})")
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.05)


def greedy(folder, prompt, steps):
    started = time.monotonic()
    # A GGUF file: transformers reads it from its folder by name and dequantizes it.
    where, extra = folder, {}
    if folder.endswith(".gguf") and os.path.isfile(folder):
        where, extra = os.path.dirname(folder) or ".", {"gguf_file": os.path.basename(folder)}
    model, info = AutoModelForCausalLM.from_pretrained(
        where,
        **extra,
        dtype=torch.float32,
        attn_implementation="eager",
        local_files_only=True,
        output_loading_info=True,
    )
    # transformers initialises a tensor the folder lacks at random and only logs it: a
    # folder our writer got wrong must fail here, not compare against noise.
    wrong = {k: sorted(v) for k, v in info.items() if v}
    if wrong:
        raise SystemExit(f"{folder}: the checkpoint does not match the model: {wrong}")
    model.eval()
    model_type = model.config.model_type
    ids = torch.tensor([prompt], dtype=torch.long)
    tokens, margins, first_logits = [], [], None
    with torch.inference_mode():
        for _ in range(steps):
            # The whole sequence each step, no cache; only the last position's logits.
            row = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float()
            if first_logits is None:
                first_logits = row.tolist()
            # torch.argmax takes the first index among equal maxima, as our greedy does.
            nxt = int(torch.argmax(row))
            top2 = torch.topk(row, 2).values
            tokens.append(nxt)
            margins.append(float(top2[0] - top2[1]))
            ids = torch.cat([ids, torch.tensor([[nxt]], dtype=torch.long)], dim=1)
    # Let the model go before the line is written: the reader may take its time.
    del model
    gc.collect()
    head = {
        "folder": folder,
        "model_type": model_type,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokens": tokens,
        "margins": margins,
        "seconds": round(time.monotonic() - started, 3),
    }
    # json.dumps writes 17 digits a float; 9 keep a float32 exact in half the text.
    logits = ",".join(format(x, ".9g") for x in first_logits)
    return json.dumps(head)[:-1] + ', "logits": [' + logits + "]}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", required=True, help="comma-separated token ids")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                   help="read each folder only once FOLDER.ready exists, waiting this long")
    p.add_argument("folders", nargs="+")
    a = p.parse_args()
    prompt = [int(x) for x in a.prompt.split(",") if x]
    if not prompt or a.steps < 1:
        p.error("need a prompt and at least one step")
    # Reproducible float32 sums: ctest runs the test with one thread, so does a manual run
    # unless told otherwise.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    parent = os.getppid()
    for folder in a.folders:
        if a.wait > 0:
            wait_for(folder + ".ready", a.wait, parent)
        print(greedy(folder, prompt, a.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
