"""test_cuda_graphs_cli.py - on a GPU: `pagoda run` and `pagoda bench` give the same tokens with
CUDA graph replay on (PAGODA_CUDA_GRAPHS=1) and off (=0), greedy and seeded sampling, and the
same with host sampling (PAGODA_DEVICE_SAMPLING=0) and with asynchronous steps off
(PAGODA_ASYNC_STEPS=0). Skips without a usable GPU (the cuda module or the device missing)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "models" / "stories260K.gguf"


def pagoda(args, env_extra, timeout=300):
    env = dict(os.environ, **env_extra)
    return subprocess.run([BIN, *args], capture_output=True, timeout=timeout, env=env)


def gpu_present():
    if not MODEL.exists() or not Path(BIN).exists():
        return False
    r = pagoda(["run", "-m", str(MODEL), "--device", "cuda", "-p", "a", "-n", "1", "--temperature", "0"], {},
               timeout=120)
    return r.returncode == 0


needs_gpu = pytest.mark.skipif(not gpu_present(), reason="no usable GPU (or the model / binary is absent)")


@needs_gpu
@pytest.mark.parametrize("temp", ["0", "0.9"])
def test_run_same_text_graphs_on_off(temp):
    args = ["run", "-m", str(MODEL), "--device", "cuda", "-p", "Once upon a time", "--raw", "--temperature", temp,
            "--seed", "11", "-n", "96"]
    on = pagoda(args, {"PAGODA_CUDA_GRAPHS": "1"})
    off = pagoda(args, {"PAGODA_CUDA_GRAPHS": "0"})
    host = pagoda(args, {"PAGODA_CUDA_GRAPHS": "1", "PAGODA_DEVICE_SAMPLING": "0"})
    sync = pagoda(args, {"PAGODA_CUDA_GRAPHS": "1", "PAGODA_ASYNC_STEPS": "0"})
    assert on.returncode == off.returncode == host.returncode == sync.returncode == 0, (on.stderr + off.stderr).decode()
    assert len(on.stdout) > 40
    assert on.stdout == off.stdout
    assert on.stdout == host.stdout
    assert on.stdout == sync.stdout


@needs_gpu
@pytest.mark.parametrize("temp", ["0", "1.0"])
@pytest.mark.parametrize("switch", ["PAGODA_CUDA_GRAPHS", "PAGODA_ASYNC_STEPS"])
def test_bench_same_tokens_on_off(switch, temp):
    """40 requests admitted over several steps (decode batches of several graph sizes), each
    ending by length, so asynchronous steps form the batches of synchronous ones (docs/cuda.md):
    the output digest is the same with the switch on and off."""
    args = ["bench", "-m", str(MODEL), "--device", "cuda", "--num-prompts", "40", "--input-len", "24",
            "--output-len", "40", "--temperature", temp, "--seed", "3", "--json"]
    runs = [pagoda(args, {switch: v}) for v in ("1", "0")]
    for r in runs:
        assert r.returncode == 0, r.stderr.decode()
    on, off = (json.loads(r.stdout) for r in runs)
    assert on["output_tokens"] == off["output_tokens"] == 40 * 40
    assert on["output_digest"] == off["output_digest"]
