#!/usr/bin/env python3
"""Writes the seed corpus of the lora_adapter fuzz target (tests/fuzz/lora_adapter_fuzz.cpp):
tiny PEFT folders for its base (hidden 16, 2 layers, 4 heads over 2 key/value heads of
width 6, intermediate 24), each as 2 bytes of config length, the config, the safetensors.
Standard library only: python3 tests/fuzz/lora_seeds.py tests/fuzz/corpus/lora_adapter"""
import json
import os
import struct
import sys

SHAPES = {"q_proj": (24, 16), "k_proj": (12, 16), "v_proj": (12, 16), "o_proj": (16, 24),
          "gate_proj": (24, 16), "up_proj": (24, 16), "down_proj": (16, 24)}
MLP = {"gate_proj", "up_proj", "down_proj"}


def safetensors(tensors):
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def folder(r, projs, dtype="F32", **config):
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": projs,
           "bias": "none", "use_dora": False, "modules_to_save": None}
    cfg.update(config)
    tensors = []
    for layer in range(2):
        for p in projs:
            out, inp = SHAPES[p]
            path = f"base_model.model.model.layers.{layer}.{'mlp' if p in MLP else 'self_attn'}.{p}"
            for kind, shape in (("lora_A", [r, inp]), ("lora_B", [out, r])):
                n = shape[0] * shape[1]
                if dtype == "F32":
                    data = struct.pack(f"<{n}f", *[(i % 7 - 3) / 4 for i in range(n)])
                else:  # BF16: the top half of the f32 bits
                    data = b"".join(struct.pack("<f", (i % 7 - 3) / 4)[2:] for i in range(n))
                tensors.append((f"{path}.{kind}.weight", dtype, shape, data))
    text = json.dumps(cfg).encode()
    return struct.pack("<H", len(text)) + text + safetensors(tensors)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {
        "seed-qv": folder(2, ["q_proj", "v_proj"]),
        "seed-all-linear-bf16": folder(1, list(SHAPES), dtype="BF16", target_modules="all-linear"),
        "seed-regex-rslora": folder(2, ["k_proj", "down_proj"], use_rslora=True,
                                    target_modules=r".*\.(k|down)_proj"),
        # libstdc++'s default backtracking takes hours on this for every path it does not
        # match (k_proj, ...); the reader matches in polynomial mode, so it reads at once.
        "regression-backtracking-regex": folder(2, ["q_proj"], target_modules=r"(.*)*(q_proj|zz)"),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
