"""test_kv_scales.py - the per-layer FP8 KV-cache scales a checkpoint carries (vLLM's names:
self_attn.k_scale / v_scale, k_proj / v_proj.output_scale, kv_scale): an f8e4m3 cache uses them
(the cache holds e4m3(x / scale), attention reads e4m3 * scale), other caches ignore them, and bad
ones are refused naming the tensor. The qwen3 fixture (2 layers) gets the tensors appended to its
model.safetensors by the small writer below (the format: an 8-byte header length, a JSON header,
the data)."""
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
FIXTURE = Path(os.environ.get("PAGODA_FIXTURES", ROOT / "tests" / "fixtures")) / "qwen3"

needs_fixture = pytest.mark.skipif(not (FIXTURE / "model.safetensors").exists(), reason="qwen3 fixture absent")


def with_tensors(tmp_path, name, extra):
    """A copy of the fixture whose model.safetensors also holds EXTRA: {name: (dtype, shape, bytes)}."""
    out = tmp_path / name
    shutil.copytree(FIXTURE, out)
    st = out / "model.safetensors"
    raw = st.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = bytearray(raw[8 + n:])
    for key, (dtype, shape, blob) in extra.items():
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    st.write_bytes(struct.pack("<Q", len(h)) + h + bytes(data))
    return out


def f32(v, shape=()):
    return ("F32", list(shape), struct.pack("<f", v))


def scales(k, v, layers=(0, 1), names=("self_attn.k_scale", "self_attn.v_scale")):
    t = {}
    for layer in layers:
        t[f"model.layers.{layer}.{names[0]}"] = f32(k[layer] if isinstance(k, dict) else k)
        t[f"model.layers.{layer}.{names[1]}"] = f32(v[layer] if isinstance(v, dict) else v)
    return t


def run(model, *args):
    r = subprocess.run([BIN, "run", "-m", str(model), "-p", "The quick brown fox", "--raw", "--temperature", "0",
                        "-n", "24", "--ignore-eos", "--max-model-len", "128", *args], capture_output=True, timeout=120)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


@needs_fixture
def test_checkpoint_scales_are_used_by_an_f8_cache(tmp_path):
    rc, base, err = run(FIXTURE, "--pa-cache-type", "f8e4m3")
    assert rc == 0, err
    assert "per-layer scales 1.0" in err
    # Scales of 1.0 read from the checkpoint: the same computation as none.
    ones = with_tensors(tmp_path, "ones", scales(1.0, 1.0))
    rc, out, err = run(ones, "--pa-cache-type", "f8e4m3")
    assert rc == 0, err
    assert "the checkpoint's per-layer k_scale / v_scale" in err
    assert out == base
    # Powers of two inside e4m3's normal range rescale without changing a single rounding
    # (the relative precision is the same across it): the same tokens again. AutoFP8's names.
    pow2 = with_tensors(tmp_path, "pow2", scales({0: 0.25, 1: 2.0}, {0: 0.5, 1: 0.125}, names=(
        "self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale")))
    rc, out, err = run(pow2, "--pa-cache-type", "f8e4m3")
    assert rc == 0, err
    assert out == base
    # A tiny scale on one layer's K saturates its keys at +-448 * scale: the scores of that
    # layer change, and so does the text. Each layer's own scale is applied.
    for layer in (0, 1):
        tiny = with_tensors(tmp_path, f"tiny{layer}", scales({layer: 1e-6, 1 - layer: 1.0}, 1.0))
        rc, out, err = run(tiny, "--pa-cache-type", "f8e4m3")
        assert rc == 0, err
        assert out != base, f"a k_scale of 1e-6 on layer {layer} left the output unchanged"
        # Other caches ignore the scales.
        rc, out_f32, err = run(tiny, "--pa-cache-type", "f32")
        rc0, base_f32, err0 = run(FIXTURE, "--pa-cache-type", "f32")
        assert rc == 0 and rc0 == 0, err + err0
        assert out_f32 == base_f32


@needs_fixture
def test_one_kv_scale_for_both(tmp_path):
    """The older single self_attn.kv_scale serves K and V; a 0-D or a one-element tensor."""
    rc, base, err = run(FIXTURE, "--pa-cache-type", "f8e4m3")
    assert rc == 0, err
    t = {"model.layers.0.self_attn.kv_scale": f32(1.0, (1,)), "model.layers.1.self_attn.kv_scale": f32(1.0)}
    rc, out, err = run(with_tensors(tmp_path, "kv", t), "--pa-cache-type", "f8e4m3")
    assert rc == 0, err
    assert "the checkpoint's per-layer k_scale / v_scale" in err and out == base


@needs_fixture
@pytest.mark.parametrize("extra, want", [
    (scales(0.0, 1.0), "model.layers.0.self_attn.k_scale' is 0"),
    (scales(float("nan"), 1.0), "must be finite and > 0"),
    (scales(1.0, 1.0, layers=(0,)), "layer 1 has no k KV-cache scale"),
    ({"model.layers.0.self_attn.k_scale": f32(1.0), "model.layers.1.self_attn.k_scale": f32(1.0)},
     "layer 0 has no v KV-cache scale"),
    ({"model.layers.0.self_attn.k_scale": ("F32", [2], struct.pack("<ff", 1, 1)),
      "model.layers.0.self_attn.v_scale": f32(1.0)}, "must be one F32, F16 or BF16 value"),
])
def test_bad_scales_are_refused(tmp_path, extra, want):
    rc, out, err = run(with_tensors(tmp_path, "bad", extra))
    assert rc != 0
    assert "error:" in err and want in err, err
    assert "model.safetensors" in err
