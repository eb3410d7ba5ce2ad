"""The Python package's first request on CUDA under each kernel-loading mode (docs/cuda.md, Kernel
loading): one process per run, so run it once per mode, e.g. on the GPU machine

    PAGODA_LIBRARY=.device/build/libpagoda.so python3 bench/python_loading.py MODEL torch-first
    PAGODA_CUDA_PRELOAD=0 ... python3 bench/python_loading.py MODEL torch-first
    ... python3 bench/python_loading.py MODEL plain
    CUDA_MODULE_LOADING=EAGER ... python3 bench/python_loading.py MODEL plain

torch-first starts CUDA with torch before pagoda is imported (as a torch program does: the loading
mode is then torch's, lazy, whatever pagoda would ask for); plain does not import torch. Prints
one line: the Runner's creation time, the first and second request (512 prompt tokens, 1 output
token), and two rounds of 64 concurrent requests of (512, 128) from 64 threads (EOS ignored,
greedy), as output tokens per second. The package is the checkout's python/ (run from a checkout,
or a copy with python/ beside bench/). Figures: bench/RESULTS.md, session 20.
"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[2] not in ("torch-first", "plain"):
        sys.exit("usage: python_loading.py MODEL torch-first|plain")
    model, mode = sys.argv[1], sys.argv[2]
    if mode == "torch-first":
        import torch
        torch.zeros(1, device="cuda")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from pagoda import CompletionRequest, Runner

    def req(i: int, n: int) -> CompletionRequest:
        return CompletionRequest(prompt=[100 + (i * 7 + k) % 30000 for k in range(512)], max_tokens=n,
                                 temperature=0, ignore_eos=True)

    t0 = time.time()
    r = Runner(model=model, device="cuda", max_num_seqs=64)
    made = time.time() - t0
    lat = []
    for i in range(2):
        s = time.time()
        r.send_completion_request(req(i, 1))
        lat.append((time.time() - s) * 1e3)
    rates = []
    for base in (2, 100):
        s = time.time()
        with ThreadPoolExecutor(64) as ex:
            outs = list(ex.map(lambda i: r.send_completion_request(req(base + i, 128)), range(64)))
        rates.append(sum(o.usage.completion_tokens for o in outs) / (time.time() - s))
    r.close()
    print(f"{mode}: Runner {made:.2f} s | first request (512 in, 1 out) {lat[0]:.1f} ms, second {lat[1]:.1f} ms | "
          f"64 x (512, 128): {rates[0]:.0f} then {rates[1]:.0f} output tok/s", flush=True)


if __name__ == "__main__":
    main()
