#!/usr/bin/env python3
"""Hugging Face transformers as an independent oracle of our forward.

Loads each local model folder with AutoModelForCausalLM in float32 with eager attention on
the CPU, decodes `--steps` tokens greedily after `--prompt`, and writes one JSON object:

    {"transformers": "5.17.0", "torch": "2.11.0",
     "models": [{"folder": "...", "model_type": "qwen2", "tokens": [...],
                 "margins": [...], "logits": [...], "seconds": 1.2}, ...]}

`tokens` are the greedy tokens (the prompt not included), `margins` each step's top logit
less the runner-up (how near a tie the choice was), and `logits` the whole vocabulary row
the first token was chosen from, each value printed with 9 significant digits (a float32
survives the round trip). One process takes every folder, because importing torch and
transformers costs seconds and the test machines have two cores.

Greedy decoding is written out here instead of calling generate(): generate() stops at the
folder's eos token and applies whatever generation_config.json says, and each step reruns
the whole sequence without a KV cache, so the oracle shares no cache logic with the forward
it checks.

Never touches the network (HF_HUB_OFFLINE is set before transformers is imported).
"""

import argparse
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


def greedy(folder, prompt, steps):
    started = time.monotonic()
    model, info = AutoModelForCausalLM.from_pretrained(
        folder,
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
    ids = torch.tensor([prompt], dtype=torch.long)
    tokens = []
    margins = []
    first_logits = None
    with torch.inference_mode():
        for _ in range(steps):
            # The whole sequence each step, no cache; only the last position's logits.
            out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
            row = out.logits[0, -1].to(torch.float32)
            if first_logits is None:
                first_logits = row.clone()
            # torch.argmax takes the first index among equal maxima, as our greedy does.
            nxt = int(torch.argmax(row))
            top2 = torch.topk(row, 2).values
            tokens.append(nxt)
            margins.append(float(top2[0] - top2[1]))
            ids = torch.cat([ids, torch.tensor([[nxt]], dtype=torch.long)], dim=1)
    result = {
        "folder": folder,
        "model_type": model.config.model_type,
        "tokens": tokens,
        "margins": margins,
        "logits": first_logits.tolist(),
        "seconds": round(time.monotonic() - started, 3),
    }
    del model
    return result


class _compact(json.JSONEncoder):
    """Floats with 9 significant digits: exact for float32, half the text of repr()."""

    def iterencode(self, o, _one_shot=False):
        if isinstance(o, float):
            yield format(o, ".9g")
            return
        if isinstance(o, dict):
            yield "{"
            for i, (k, v) in enumerate(o.items()):
                if i:
                    yield ", "
                yield json.dumps(k) + ": "
                yield from self.iterencode(v)
            yield "}"
            return
        if isinstance(o, list):
            if o and all(isinstance(x, float) for x in o):
                yield "[" + ",".join(format(x, ".9g") for x in o) + "]"
                return
            yield "["
            for i, v in enumerate(o):
                if i:
                    yield ", "
                yield from self.iterencode(v)
            yield "]"
            return
        yield json.dumps(o)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", required=True, help="comma-separated token ids")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", help='write the JSON here, then print "done" (default: stdout)')
    p.add_argument("folders", nargs="+")
    a = p.parse_args()
    prompt = [int(x) for x in a.prompt.split(",") if x]
    if not prompt or a.steps < 1:
        p.error("need a prompt and at least one step")
    # Reproducible float32 sums: the ctest environment runs one thread, so should a manual
    # run unless told otherwise.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    result = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "models": [greedy(f, prompt, a.steps) for f in a.folders],
    }
    text = "".join(_compact().iterencode(result)) + "\n"
    if a.out:
        with open(a.out + ".part", "w") as f:
            f.write(text)
        os.replace(a.out + ".part", a.out)  # the reader never sees half a file
        print("done", flush=True)  # the test waits for this line
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
