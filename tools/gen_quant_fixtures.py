#!/usr/bin/env python3
"""Writes tests/fixtures/quant/: reference (de)quantizations made by gguf-py (PyPI `gguf`), so
that pagoda's block layouts (src/util/quant.c) are checked against code pagoda did not write.

For every type T:
  T.blocks  random blocks (random bytes; scale fields set to finite f16 values)
  T.deq     gguf-py's dequantization of T.blocks (f32, little-endian)
For the types gguf-py can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
  T.q       gguf-py's quantization of src.f32
For --isq (tests/c/test_isq.c): llama_wq.T for T in q4_0, q8_0: gguf-py's quantization of
  model.layers.0.self_attn.q_proj.weight of tests/fixtures/llama (f32 safetensors).
src.f32: N_ELEMS random f32 values (normal, some outliers, one all-zero block of 256).

Usage: .venv/bin/python tools/gen_quant_fixtures.py [OUT_DIR]   (needs: pip install gguf numpy)
"""
import json
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, quants

N_ELEMS = 2048  # 8 super-blocks of 256
# f16 fields (byte offsets) of each block type, given finite values instead of random bytes.
HALF_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "fixtures", "quant")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261123)
    src = rng.standard_normal(N_ELEMS).astype(np.float32)
    src[rng.integers(0, N_ELEMS, 16)] *= 8  # outliers
    src[512:768] = 0  # an all-zero block: scale 0
    src[1024:1056] = np.abs(src[1024:1056])  # a block of one sign
    src.tofile(os.path.join(out, "src.f32"))
    for t, fields in HALF_FIELDS.items():
        bs, ts = GGML_QUANT_SIZES[t]
        nb = N_ELEMS // bs
        blocks = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
        for off in fields:
            h = (rng.uniform(-1, 1, nb) * 2.0 ** rng.integers(-8, 2, nb)).astype(np.float16)
            blocks[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
        name = t.name.lower()
        blocks.tofile(os.path.join(out, name + ".blocks"))
        deq = quants.dequantize(blocks.reshape(-1), t).astype(np.float32)
        assert deq.size == N_ELEMS and np.all(np.isfinite(deq))
        deq.tofile(os.path.join(out, name + ".deq"))
        if t in QUANTIZABLE:
            q = quants.quantize(src.reshape(1, -1), t)
            q.tofile(os.path.join(out, name + ".q"))
    isq_fixtures(out)


def isq_fixtures(out):
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "llama", "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        info = header["model.layers.0.self_attn.q_proj.weight"]
        assert info["dtype"] == "F32"
        a, b = info["data_offsets"]
        f.seek(8 + n + a)
        w = np.frombuffer(f.read(b - a), dtype=np.float32).reshape(info["shape"])
    for t in (T.Q4_0, T.Q8_0):
        quants.quantize(w, t).tofile(os.path.join(out, "llama_wq." + t.name.lower()))


if __name__ == "__main__":
    main()
