#!/usr/bin/env python3
"""The gguf Python package (llama.cpp's own, pinned in scripts/python-requirements.txt) as
the oracle for common/gguf (tests/models/gguf_test.cpp).

  gguf_oracle.py tiny OUT_DIR        writes tiny GGUF files with GGUFWriter (metadata of every
                                     type, tensors quantized by gguf.quants.quantize) and what
                                     a reader must find in them
  gguf_oracle.py real GGUF OUT_DIR   reads a real file with GGUFReader: its tensor infos, a few
                                     metadata values, and a few tensors dequantized

What a reader must find goes to OUT_DIR/oracle.json; each dequantized tensor to
OUT_DIR/<tensor name>.f32 as raw little-endian float32 (bit-exact, NaN and infinity
included; of a real file, the rows oracle.json names). Prints "done" once everything is written.
"""
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V


def type_table():
    """ggml's types as the package knows them: id -> name, block elements, block bytes."""
    return {str(int(t)): {"name": t.name, "block": size[0], "bytes": size[1]}
            for t, size in gguf.GGML_QUANT_SIZES.items()}


def metadata_cases():
    """(key, type, value, element type): one of each GGUF value type, and arrays."""
    return [
        ("test.u8", V.UINT8, 250, None),
        ("test.i8", V.INT8, -100, None),
        ("test.u16", V.UINT16, 65000, None),
        ("test.i16", V.INT16, -32000, None),
        ("test.u32", V.UINT32, 4000000000, None),
        ("test.i32", V.INT32, -2000000000, None),
        ("test.f32", V.FLOAT32, float(np.float32(0.1)), None),
        ("test.bool_true", V.BOOL, True, None),
        ("test.bool_false", V.BOOL, False, None),
        ("test.string", V.STRING, "h\u00e9llo \u4e16\u754c", None),
        ("test.u64", V.UINT64, 18000000000000000000, None),
        ("test.i64", V.INT64, -9000000000000000000, None),
        ("test.f64", V.FLOAT64, 2.0 ** -1074, None),
        ("test.strings", V.ARRAY, ["<s>", "", "\u0120the", "a b", "\u00e9"], V.STRING),
        ("test.i32s", V.ARRAY, [1, -2, 3, 2147483647], V.INT32),
        ("test.u8s", V.ARRAY, [0, 1, 255], V.UINT8),
        ("test.u64s", V.ARRAY, [0, 18446744073709551615], V.UINT64),
        ("test.i16s", V.ARRAY, [-32768, 32767], V.INT16),
        ("test.f32s", V.ARRAY, [float(np.float32(x)) for x in (-1.5, 0.0, 3.25e-5, -0.0)],
         V.FLOAT32),
        ("test.f64s", V.ARRAY, [1.0 / 3.0, -2.5], V.FLOAT64),
        ("test.bools", V.ARRAY, [True, False, True], V.BOOL),
        ("test.nested", V.ARRAY, [[1, 2], [3], [4, 5, 6]], V.ARRAY),
        ("tokenizer.ggml.model", V.STRING, "gpt2", None),
    ]


def tiny_tensors(rng):
    """(name, numpy shape, type, float32 values before quantization)."""
    def normal(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    specials = np.array([np.inf, -np.inf, -0.0, 0.0, 65504.0, 6e-8, -6.1e-5, 1e-3],
                        dtype=np.float32)
    f16 = normal(2, 32)
    f16[0, :8] = specials
    rows = normal(4, 64)
    rows[1, :] = 0.0          # a zero block: d = 0
    rows[2, :32] = 0.75       # a flat block: Q4_1's max == min
    rows[3, 32:] *= 1000.0    # a large scale
    return [
        ("f32.vector", (5,), Q.F32, normal(5)),
        ("f32.cube", (2, 3, 4), Q.F32, normal(2, 3, 4)),
        ("f16.matrix", (2, 32), Q.F16, f16),
        ("bf16.matrix", (2, 32), Q.BF16, np.concatenate([specials, normal(56)]).reshape(2, 32)),
        ("q8_0.matrix", (4, 64), Q.Q8_0, rows),
        ("q4_0.matrix", (4, 64), Q.Q4_0, rows),
        ("q4_1.matrix", (4, 64), Q.Q4_1, rows),
    ]


def write_f32(out_dir, name, values):
    np.asarray(values, dtype="<f4").tofile(os.path.join(out_dir, name + ".f32"))


def tiny(out_dir):
    rng = np.random.default_rng(20260101)
    # The same tensors in both files: the expected values are written once.
    cases = tiny_tensors(rng)
    q6_k = rng.integers(0, 256, (2, 210), dtype=np.uint8)
    files = {}
    for file_name, alignment in (("tiny.gguf", None), ("aligned.gguf", 64)):
        w = gguf.GGUFWriter(os.path.join(out_dir, file_name), "llama")
        if alignment:
            w.add_custom_alignment(alignment)
        for key, vtype, value, sub in metadata_cases():
            w.add_key_value(key, value, vtype, sub_type=sub)
        tensors = []
        for name, shape, qtype, values in cases:
            data = gguf.quants.quantize(values, qtype)
            w.add_tensor(name, data, raw_dtype=qtype)
            if file_name == "tiny.gguf":
                write_f32(out_dir, name, gguf.quants.dequantize(data, qtype))
            tensors.append({"name": name, "type": int(qtype), "dims": list(reversed(shape))})
        # Bytes a reader may map but not dequantize.
        w.add_tensor("q6_k.matrix", q6_k, raw_dtype=Q.Q6_K)
        tensors.append({"name": "q6_k.matrix", "type": int(Q.Q6_K), "dims": [256, 2]})
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        files[file_name] = {"alignment": alignment or 32, "tensors": tensors}
    metadata = [{"key": k, "type": t.name.lower(), "value": v,
                 "element_type": s.name.lower() if s is not None else None}
                for k, t, v, s in metadata_cases()]
    return {"files": files, "metadata": metadata, "types": type_table()}


def real(path, out_dir):
    r = gguf.GGUFReader(path)
    tensors = []
    for t in r.tensors:
        raw = t.data.view(np.uint8).reshape(-1)
        tensors.append({"name": t.name, "type": int(t.tensor_type),
                        "dims": [int(d) for d in t.shape], "bytes": int(t.n_bytes),
                        "head": raw[:16].tobytes().hex(), "tail": raw[-16:].tobytes().hex()})
    field = lambda key: r.fields[key].contents()  # noqa: E731
    tokens = r.fields["tokenizer.ggml.tokens"]
    merges = r.fields["tokenizer.ggml.merges"]
    token_types = field("tokenizer.ggml.token_type")
    # A few tensors dequantized: exact checksums of every value's bits (sum and xor, which
    # do not depend on order), and some rows written out.
    by_name = {t.name: t for t in r.tensors}
    dequantized = {}
    for name, rows in (("token_embd.weight", [0, 1, 2, 12345, 49151]),
                       ("blk.0.attn_q.weight", None), ("blk.29.ffn_down.weight", [0, 575]),
                       ("output_norm.weight", None)):
        t = by_name[name]
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))
        bits = values.view(np.uint32).reshape(-1)
        rows = rows if rows is not None else list(range(values.shape[0]))
        write_f32(out_dir, name, values[rows])
        dequantized[name] = {"rows": rows, "bits_sum": int(bits.astype(np.uint64).sum()),
                             "bits_xor": int(np.bitwise_xor.reduce(bits))}
    return {
        "tensors": tensors,
        "dequantized": dequantized,
        "metadata": {
            "general.architecture": field("general.architecture"),
            "llama.block_count": field("llama.block_count"),
            "llama.context_length": field("llama.context_length"),
            "llama.rope.freq_base": field("llama.rope.freq_base"),
            "tokenizer.ggml.model": field("tokenizer.ggml.model"),
        },
        "tokens": {"count": len(tokens.data), "first": tokens.contents(slice(0, 20)),
                   "last": tokens.contents(len(tokens.data) - 1)},
        "merges": {"count": len(merges.data), "first": merges.contents(slice(0, 20))},
        "token_types": {"count": len(token_types), "first": token_types[:20]},
    }


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "tiny":
        out_dir, answer = sys.argv[2], tiny(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "real":
        out_dir, answer = sys.argv[3], real(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
    with open(os.path.join(out_dir, "oracle.json"), "w") as f:
        json.dump(answer, f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
