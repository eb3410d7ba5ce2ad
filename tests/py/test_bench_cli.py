"""test_bench_cli.py - `pagoda bench --json` on stories260K: the JSON fields, KV waste under 4% at
block size 32 on mixed lengths (64 to 2048), >= 90% of a 1024-token shared prefix served from the
prefix cache over 64 requests with the prefill work dropping accordingly, and a tiny pool that
preempts without losing tokens."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "models" / "stories260K.gguf"

needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"shared test data absent: {MODEL}")

FIELDS = ["requests", "input_tokens", "output_tokens", "elapsed_s", "output_tok_per_s", "total_tok_per_s",
          "ttft_ms", "tpot_ms", "kv_peak_usage", "kv_waste_fraction", "prefix_cache_hit_rate", "preemptions"]


def bench(*args):
    r = subprocess.run([BIN, "bench", "-m", str(MODEL), "--json", *args], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


@needs_model
def test_shared_prefix_hits_and_prefill_drop():
    args = ["--num-prompts", "64", "--input-len", "1040", "--shared-prefix-len", "1024", "--output-len", "4"]
    on = bench(*args)
    off = bench("--num-prompts", "8", *args[2:], "--prefix-cache-n", "0")
    for f in FIELDS:
        assert f in on, f
    assert set(on["ttft_ms"]) == {"p50", "p99"} and set(on["tpot_ms"]) == {"p50", "p99"}
    assert on["requests"] == 64 and on["input_tokens"] == 64 * 1040 and on["output_tokens"] == 64 * 4
    assert on["prefix_cache_hit_tokens"] >= 0.9 * 64 * 1024
    assert on["shared_prefix_hit_fraction"] >= 0.9
    assert off["prefix_cache_hit_rate"] == 0 and off["prompt_tokens_computed"] == 8 * 1040
    # the prefill work drops by the hit tokens
    assert on["prompt_tokens_computed"] == on["input_tokens"] - on["prefix_cache_hit_tokens"]
    assert on["prompt_tokens_computed"] <= 64 * 1040 - 0.9 * 64 * 1024


@needs_model
def test_kv_waste_on_mixed_lengths():
    # prompt lengths uniform in [66, 2046] (1056 +- 93.75%), outputs 8 +- 93.75%
    r = bench("--num-prompts", "16", "--input-len", "1056", "--random-range-ratio", "0.9375", "--output-len", "8",
              "--pa-block-size", "32")
    assert r["block_size"] == 32
    assert 0 < r["kv_waste_fraction"] < 0.04
    off = bench("--num-prompts", "16", "--input-len", "1056", "--random-range-ratio", "0.9375", "--output-len", "8",
                "--paged-attn", "off")
    assert off["kv_waste_fraction"] > 0.3  # contiguous regions reserve the whole context


@needs_model
def test_tiny_pool_preempts_without_loss():
    r = bench("--num-prompts", "32", "--input-len", "200", "--output-len", "64", "--pa-memory-mb", "3",
              "--max-model-len", "512")
    assert r["preemptions"] > 0 and r["kv_peak_usage"] > 0.9
    assert r["output_tokens"] == 32 * 64
    assert r["prompt_tokens_computed"] > r["input_tokens"]  # recomputation after preemption


def test_bench_bad_flags():
    r = subprocess.run([BIN, "bench", "-m", str(MODEL), "--num-prompts", "0"], capture_output=True)
    assert r.returncode == 2 and b"--num-prompts" in r.stderr
    r = subprocess.run([BIN, "bench", "--input-len", "5"], capture_output=True,
                       env={**os.environ, "PAGODA_MODEL": "/nonexistent/env-model.gguf"})
    assert r.returncode == 1 and b"/nonexistent/env-model.gguf" in r.stderr
