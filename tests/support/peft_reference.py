#!/usr/bin/env python3
"""transformers + peft as an independent oracle of our forward with a LoRA adapter.

Each case is BASE_FOLDER:ADAPTER_FOLDER (ADAPTER_FOLDER empty for the base alone). The base
is loaded with AutoModelForCausalLM in float32 with eager attention on the CPU, the adapter
applied with peft's PeftModel.from_pretrained (never merged: peft's own LoRA layers run),
and `--steps` tokens are decoded greedily after `--prompt`. One JSON line per case, in order:

    {"case": "...", "peft": "0.21.2", "transformers": "5.17.0", "lora_modules": 14,
     "tokens": [...], "logits": [[...], ...]}

`logits` holds each step's last-position row (the vocabulary the token was chosen from),
9 significant digits a value (a float32 survives the round trip). Each step reruns the
whole sequence without a KV cache, so the oracle shares no cache logic with ours.

Before running, every tensor of adapter_model.safetensors must sit, unchanged, in one of
peft's LoRA layers: peft only warns about a tensor it does not recognise, and an adapter it
silently dropped would compare our adapted model against the base.

Never touches the network (HF_HUB_OFFLINE is set before transformers is imported).
"""

import argparse
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

try:
    import peft  # noqa: E402
    from peft import PeftModel  # noqa: E402
except ImportError as e:
    raise SystemExit(f"peft is missing ({e}): scripts/setup installs it")
from safetensors.torch import load_file  # noqa: E402


def check_adapter_applied(model, adapter):
    """Every saved tensor, under peft's name for it ("...lora_A.default.weight"), unchanged."""
    state = model.state_dict()
    saved = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    for name, want in saved.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        if key not in state:
            raise SystemExit(f"{adapter}: peft did not load {name} (no {key} in the model)")
        if not torch.equal(state[key].float(), want.float()):
            raise SystemExit(f"{adapter}: peft holds other values for {name}")
    return sum(1 for n in state if n.endswith(".lora_A.default.weight"))


def run(case, prompt, steps):
    base, _, adapter = case.partition(":")
    model, info = AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="eager", local_files_only=True,
        output_loading_info=True)
    # A tensor the folder lacks would be initialised at random and only logged.
    wrong = {k: sorted(v) for k, v in info.items() if v}
    if wrong:
        raise SystemExit(f"{base}: the checkpoint does not match the model: {wrong}")
    lora_modules = 0
    if adapter:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=False)
        lora_modules = check_adapter_applied(model, adapter)
    model.eval()
    ids = torch.tensor([prompt], dtype=torch.long)
    tokens, rows = [], []
    with torch.inference_mode():
        for _ in range(steps):
            row = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            rows.append("[" + ",".join(format(x, ".9g") for x in row.tolist()) + "]")
            # torch.argmax takes the first index among equal maxima, as our greedy does.
            nxt = int(torch.argmax(row))
            tokens.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], dtype=torch.long)], dim=1)
    head = {"case": case, "peft": peft.__version__, "transformers": transformers.__version__,
            "lora_modules": lora_modules, "tokens": tokens}
    return json.dumps(head)[:-1] + ', "logits": [' + ",".join(rows) + "]}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", required=True, help="comma-separated token ids")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("cases", nargs="+", metavar="BASE:ADAPTER")
    a = p.parse_args()
    prompt = [int(x) for x in a.prompt.split(",") if x]
    if not prompt or a.steps < 1:
        p.error("need a prompt and at least one step")
    # Reproducible float32 sums, as hf_forward_oracle.py.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    for case in a.cases:
        print(run(case, prompt, a.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
