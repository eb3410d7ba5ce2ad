"""Python overhead of `pagoda.Runner.generate` against the C engine (`pagoda bench`) on the CPU.

Same workload both ways: NUM_PROMPTS prompts of INPUT_LEN random token ids, OUTPUT_LEN tokens
each (EOS ignored), temperature 1, queued at once. Reports, best of REPEATS (runs interleaved):
  - wall time per generated token of each, and the ratio;
  - the Python thread's own CPU time per token (time.thread_time around generate: converting
    events to Python objects and the ctypes calls; the engine runs on its own C thread), as a
    fraction of the C engine's wall time per token. This is the overhead figure: it does not
    depend on how loaded the machine is.
Usage: PAGODA_LIBRARY=build/libpagoda.so python bench/python_overhead.py --bin build/pagoda -m MODEL
"""
import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import pagoda  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/pagoda")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    common = ["-m", a.model, "--device", "cpu", "-t", str(a.threads), "--pa-memory-mb", "256"]
    runner = pagoda.Runner(model=a.model, device="cpu", threads=a.threads, pa_memory_mb=256)
    vocab = runner.stats() and pagoda._ffi.lib().pagoda_vocab_size(runner._e)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(a.input_len)] for _ in range(a.num_prompts)]
    sps = [pagoda.SamplingParams(temperature=1.0, seed=i, max_tokens=a.output_len, ignore_eos=True)
           for i in range(a.num_prompts)]
    c_best = py_best = cpu_best = float("inf")
    for _ in range(a.repeats):
        out = subprocess.run([a.bin, "bench", *common, "--json", "--num-prompts", str(a.num_prompts),
                              "--input-len", str(a.input_len), "--output-len", str(a.output_len)],
                             check=True, capture_output=True, text=True).stdout
        d = json.loads(out)
        c_best = min(c_best, d["elapsed_s"] / d["output_tokens"])
        t0, c0 = time.perf_counter(), time.thread_time()
        res = runner.generate(prompts, sps)
        t1, c1 = time.perf_counter(), time.thread_time()
        ntok = sum(len(o.outputs[0].token_ids) for o in res)
        assert ntok == a.num_prompts * a.output_len
        py_best = min(py_best, (t1 - t0) / ntok)
        cpu_best = min(cpu_best, (c1 - c0) / ntok)
    runner.close()
    print(json.dumps({
        "num_prompts": a.num_prompts, "input_len": a.input_len, "output_len": a.output_len,
        "c_engine_us_per_token": round(c_best * 1e6, 2), "python_wall_us_per_token": round(py_best * 1e6, 2),
        "wall_ratio": round(py_best / c_best, 4),
        "python_thread_cpu_us_per_token": round(cpu_best * 1e6, 2),
        "python_overhead_fraction": round(cpu_best / c_best, 4)}))


if __name__ == "__main__":
    main()
