"""bench/lora.sh's helper: writes seeded random Hugging Face folders (Llama family) and PEFT
LoRA folders, and drives `computron serve` over HTTP for the figures of issue 47.

  base DIR --type T --hidden H --layers L --heads N --kv K --ffn F --vocab V [--tie]
  adapters DIR --base-dir BASE --base-name NAME --count N --rank R --projs P,P [--distinct D]
      (N folders DIR/<prefix>-00000..., D distinct weight files, the rest hard links to them)
  spread PORT --prefix P --count N --requests R --concurrency C --max-tokens T
  decode PORT --models M,M,... --concurrency C --max-tokens T --prompt-len P
  metrics PORT NAME              (computron_model_load_seconds_total and loads of NAME)
  complete PORT MODEL --max-tokens T  (one request, prints its seconds)
  register PORT NAME PATH [BASE] (POST /v1/load_lora_adapter, prints its seconds)
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import sys
import time
import urllib.error
import urllib.request

PROMPT_SEED = 7


def hf_names(a):
    """(name, shape) of every tensor of a Llama-family HF checkpoint of shape `a`."""
    hd = a.hidden // a.heads
    out = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (a.hidden,)),
            (p + "self_attn.q_proj.weight", (a.heads * hd, a.hidden)),
            (p + "self_attn.k_proj.weight", (a.kv * hd, a.hidden)),
            (p + "self_attn.v_proj.weight", (a.kv * hd, a.hidden)),
            (p + "self_attn.o_proj.weight", (a.hidden, a.heads * hd)),
            (p + "post_attention_layernorm.weight", (a.hidden,)),
            (p + "mlp.gate_proj.weight", (a.ffn, a.hidden)),
            (p + "mlp.up_proj.weight", (a.ffn, a.hidden)),
            (p + "mlp.down_proj.weight", (a.hidden, a.ffn)),
        ]
        if a.type == "qwen2":
            out += [(p + "self_attn.q_proj.bias", (a.heads * hd,)),
                    (p + "self_attn.k_proj.bias", (a.kv * hd,)),
                    (p + "self_attn.v_proj.bias", (a.kv * hd,))]
    out.append(("model.norm.weight", (a.hidden,)))
    if not a.tie:
        out.append(("lm_head.weight", (a.vocab, a.hidden)))
    return out


def write_base(a):
    import torch
    from safetensors.torch import save_file
    os.makedirs(a.dir, exist_ok=True)
    g = torch.Generator().manual_seed(a.seed)
    names = hf_names(a)
    # One file per layer-sized group, so no more than one group is in memory at once.
    shards, cur, size = [], [], 0
    for n, s in names:
        cur.append((n, s))
        size += 2 * (s[0] * (s[1] if len(s) > 1 else 1))
        if size > (512 << 20):
            shards.append(cur)
            cur, size = [], 0
    if cur:
        shards.append(cur)
    weight_map, total = {}, 0
    for k, group in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for n, s in group:
            if n.endswith("norm.weight"):
                t = torch.ones(s, dtype=torch.bfloat16)
            else:
                t = (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16)
            tensors[n] = t
            weight_map[n] = fname
            total += t.numel() * 2
        save_file(tensors, os.path.join(a.dir, fname), metadata={"format": "pt"})
        del tensors
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(a.dir, "model.safetensors.index.json"), "w"))
    arch = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[a.type]
    cfg = {"architectures": [arch], "model_type": a.type, "hidden_size": a.hidden,
           "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv,
           "vocab_size": a.vocab, "max_position_embeddings": a.max_positions,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
           "tie_word_embeddings": a.tie, "torch_dtype": "bfloat16",
           "bos_token_id": 1, "eos_token_id": 2}
    json.dump(cfg, open(os.path.join(a.dir, "config.json"), "w"), indent=1)
    print(f"base {a.dir}: {total / 1e6:.1f} MB bf16 in {len(shards)} files")


def write_adapters(a):
    import torch
    from safetensors.torch import save_file
    cfg = json.load(open(os.path.join(a.base_dir, "config.json")))
    hidden, ffn = cfg["hidden_size"], cfg["intermediate_size"]
    hd = hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    dims = {"q_proj": ("self_attn", hidden, q), "k_proj": ("self_attn", hidden, kv),
            "v_proj": ("self_attn", hidden, kv), "o_proj": ("self_attn", q, hidden),
            "gate_proj": ("mlp", hidden, ffn), "up_proj": ("mlp", hidden, ffn),
            "down_proj": ("mlp", ffn, hidden)}
    projs = a.projs.split(",")
    os.makedirs(a.dir, exist_ok=True)
    peft = {"peft_type": "LORA", "r": a.rank, "lora_alpha": 2 * a.rank, "target_modules": projs,
            "base_model_name_or_path": a.base_name, "bias": "none", "fan_in_fan_out": False,
            "use_dora": False, "use_rslora": False, "modules_to_save": None,
            "rank_pattern": {}, "alpha_pattern": {}, "lora_dropout": 0.0,
            "task_type": "CAUSAL_LM"}
    firsts, nbytes = [], 0
    for j in range(a.count):
        d = os.path.join(a.dir, f"{a.prefix}-{j:05d}" if a.count > 1 else a.prefix)
        os.makedirs(d, exist_ok=True)
        json.dump(peft, open(os.path.join(d, "adapter_config.json"), "w"))
        st = os.path.join(d, "adapter_model.safetensors")
        if os.path.exists(st):
            os.remove(st)
        if j < a.distinct:
            g = torch.Generator().manual_seed(a.seed + j)
            tensors = {}
            for i in range(cfg["num_hidden_layers"]):
                for p in projs:
                    mod, i_n, o_n = dims[p]
                    base = f"base_model.model.model.layers.{i}.{mod}.{p}"
                    tensors[base + ".lora_A.weight"] = (
                        torch.randn((a.rank, i_n), generator=g) * 0.02).to(torch.bfloat16)
                    tensors[base + ".lora_B.weight"] = (
                        torch.randn((o_n, a.rank), generator=g) * 0.02).to(torch.bfloat16)
            save_file(tensors, st, metadata={"format": "pt"})
            nbytes = sum(t.numel() * 2 for t in tensors.values())
            firsts.append(st)
        else:
            os.link(firsts[j % a.distinct], st)
    print(f"{a.count} adapters under {a.dir} ({a.distinct} distinct weight files, "
          f"{nbytes / 1e6:.2f} MB bf16 each, rank {a.rank} on {a.projs})")


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def prompt(n, seed=PROMPT_SEED):
    rnd = random.Random(seed)
    return [rnd.randrange(3, 1000) for _ in range(n)]


def completion(port, model, max_tokens, plen=8, seed=PROMPT_SEED):
    body = {"model": model, "prompt": prompt(plen, seed), "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    t = time.perf_counter()
    status, raw = post(port, "/v1/completions", body)
    dt = time.perf_counter() - t
    tokens = 0
    if status == 200:
        tokens = json.loads(raw)["usage"]["completion_tokens"]
    return status, dt, tokens, raw


def spread(a):
    rnd = random.Random(1)
    names = [f"{a.prefix}-{rnd.randrange(a.count):05d}" for _ in range(a.requests)]
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(a.concurrency) as ex:
        res = list(ex.map(lambda n: completion(a.port, n, a.max_tokens, seed=hash(n) & 0xffff),
                          names))
    wall = time.perf_counter() - t
    ok = [r for r in res if r[0] == 200 and r[2] == a.max_tokens]
    bad = [r for r in res if not (r[0] == 200 and r[2] == a.max_tokens)]
    lat = sorted(r[1] for r in ok)
    print(json.dumps({"requests": len(res), "served": len(ok), "failed": len(bad),
                      "distinct_adapters": len(set(names)), "wall_s": round(wall, 2),
                      "p50_ms": round(1e3 * lat[len(lat) // 2], 1) if lat else None,
                      "max_ms": round(1e3 * lat[-1], 1) if lat else None,
                      "first_failures": [(r[0], r[3][:300].decode(errors="replace"))
                                         for r in bad[:3]]}))


def decode(a):
    models = a.models.split(",")
    names = [models[i % len(models)] for i in range(a.concurrency)]
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(a.concurrency) as ex:
        res = list(ex.map(lambda ix: completion(a.port, ix[1], a.max_tokens, a.prompt_len,
                                                seed=ix[0]), enumerate(names)))
    wall = time.perf_counter() - t
    tokens = sum(r[2] for r in res)
    bad = [r for r in res if r[0] != 200 or r[2] != a.max_tokens]
    print(json.dumps({"models": len(models), "requests": len(res), "failed": len(bad),
                      "tokens": tokens, "wall_s": round(wall, 3),
                      "tokens_per_s": round(tokens / wall, 2),
                      "first_failure": bad[0][3][:300].decode(errors="replace") if bad else None}))


def metrics(a):
    with urllib.request.urlopen(f"http://127.0.0.1:{a.port}/metrics") as r:
        text = r.read().decode()
    out = {}
    for key in ("computron_model_load_seconds_total", "computron_model_loads_total"):
        m = re.search(key + r'\{[^}]*model="' + re.escape(a.name) + r'"[^}]*\}\s+([0-9.e+-]+)',
                      text)
        out[key] = float(m.group(1)) if m else 0.0
    print(json.dumps(out))


def complete_cmd(a):
    status, dt, tokens, raw = completion(a.port, a.model, a.max_tokens, a.prompt_len, a.seed)
    if status != 200 or tokens != a.max_tokens:
        print(f"failed {status}: {raw[:300]!r}", file=sys.stderr)
        sys.exit(1)
    print(f"{dt:.4f}")


def register(a):
    body = {"lora_name": a.name, "lora_path": a.path}
    if a.base:
        body["base_model_name"] = a.base
    t = time.perf_counter()
    status, raw = post(a.port, "/v1/load_lora_adapter", body)
    dt = time.perf_counter() - t
    if status != 200:
        print(f"failed {status}: {raw[:300]!r}", file=sys.stderr)
        sys.exit(1)
    print(f"{dt:.4f}")


def load(a):
    """A registered model (an adapter too) onto its devices, before any request asks for it:
    the load alone, with no compute beside it."""
    t = time.perf_counter()
    status, raw = post(a.port, f"/v2/repository/models/{a.name}/load", {})
    dt = time.perf_counter() - t
    if status != 200:
        print(f"failed {status}: {raw[:300]!r}", file=sys.stderr)
        sys.exit(1)
    print(f"{dt:.4f}")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("base")
    b.add_argument("dir")
    for k in ("hidden", "layers", "heads", "kv", "ffn", "vocab"):
        b.add_argument("--" + k, type=int, required=True)
    b.add_argument("--type", default="llama")
    b.add_argument("--tie", action="store_true")
    b.add_argument("--max-positions", type=int, default=1024)
    b.add_argument("--seed", type=int, default=1)
    d = sub.add_parser("adapters")
    d.add_argument("dir")
    d.add_argument("--base-dir", required=True)
    d.add_argument("--base-name", required=True)
    d.add_argument("--prefix", default="lora")
    d.add_argument("--count", type=int, default=1)
    d.add_argument("--distinct", type=int, default=1)
    d.add_argument("--rank", type=int, default=16)
    d.add_argument("--projs", default="q_proj,v_proj")
    d.add_argument("--seed", type=int, default=100)
    s = sub.add_parser("spread")
    s.add_argument("port")
    s.add_argument("--prefix", default="lora")
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--requests", type=int, default=200)
    s.add_argument("--concurrency", type=int, default=16)
    s.add_argument("--max-tokens", type=int, default=4)
    c = sub.add_parser("decode")
    c.add_argument("port")
    c.add_argument("--models", required=True)
    c.add_argument("--concurrency", type=int, default=32)
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--prompt-len", type=int, default=16)
    m = sub.add_parser("metrics")
    m.add_argument("port")
    m.add_argument("name")
    o = sub.add_parser("complete")
    o.add_argument("port")
    o.add_argument("model")
    o.add_argument("--max-tokens", type=int, default=1)
    o.add_argument("--prompt-len", type=int, default=16)
    o.add_argument("--seed", type=int, default=PROMPT_SEED)
    r = sub.add_parser("register")
    r.add_argument("port")
    r.add_argument("name")
    r.add_argument("path")
    r.add_argument("base", nargs="?", default="")
    lo = sub.add_parser("load")
    lo.add_argument("port")
    lo.add_argument("name")
    a = p.parse_args()
    {"base": write_base, "adapters": write_adapters, "spread": spread, "decode": decode,
     "metrics": metrics, "complete": complete_cmd, "register": register, "load": load}[a.cmd](a)


if __name__ == "__main__":
    main()
