"""hub_bench.py - the cost of naming a model by Hugging Face repo id: a download over loopback
from tests/py/hub_server.py (a 256 MiB LFS file, sha256-checked), and `pagoda tokenize` start-up
with a local path, a cached repo id online (one API request) and a cached repo id offline.
Usage: python bench/hub_bench.py [--bin build/pagoda]"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "py"))
from hub_server import Hub, Repo  # noqa: E402

GGUF = ROOT.parent / "shared" / "testdata" / "models" / "stories260K.gguf"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--mib", type=int, default=256)
    a = ap.parse_args()
    big = os.urandom(a.mib << 20)
    with Hub() as h, tempfile.TemporaryDirectory() as t:
        r = Repo()
        r.add_commit({"stories260K.gguf": GGUF.read_bytes()})
        h.repos["bench/stories"] = r
        r = Repo()
        r.add_commit({"big.gguf": big})
        h.repos["bench/big"] = r
        env = dict(os.environ, HF_HUB_CACHE=t + "/cache", HF_ENDPOINT=h.url, HOME=t)
        env.pop("HF_HUB_OFFLINE", None)

        def run(args, **extra):
            t0 = time.perf_counter()
            p = subprocess.run([a.bin, "tokenize", *args], env=dict(env, **extra), input=b"hi",
                               capture_output=True)
            return time.perf_counter() - t0, p

        def median(args, n=20, **extra):
            ts = []
            for _ in range(n):
                dt, p = run(args, **extra)
                assert p.returncode == 0, p.stderr.decode()
                ts.append(dt)
            return sorted(ts)[n // 2] * 1000

        run(["-m", "bench/big"])  # warms the server's digests (the API call); the file is then fetched:
        dt, p = run(["-m", "bench/big"], HF_HUB_CACHE=t + "/cache2")
        assert b"downloading bench/big/big.gguf" in p.stderr, p.stderr.decode()
        print(f"download {a.mib} MiB LFS file over loopback, sha256 checked: {dt:.2f} s ({a.mib / dt:.0f} MiB/s)")
        sha = h.repos["bench/big"].refs["main"]
        t0 = time.perf_counter()
        subprocess.run(["curl", "-sfL", "-o", t + "/curl.out", f"{h.url}/bench/big/resolve/{sha}/big.gguf"], check=True)
        dt = time.perf_counter() - t0
        print(f"the same with the curl command (no check), for reference:  {dt:.2f} s ({a.mib / dt:.0f} MiB/s)")
        run(["-m", "bench/stories"])
        print(f"tokenize -m local.gguf                       median of 20: {median(['-m', str(GGUF)]):.1f} ms")
        print(f"tokenize -m org/name, cached, online          median of 20: {median(['-m', 'bench/stories']):.1f} ms")
        print(f"tokenize -m org/name, cached, HF_HUB_OFFLINE=1 median of 20: "
              f"{median(['-m', 'bench/stories'], HF_HUB_OFFLINE='1'):.1f} ms")


if __name__ == "__main__":
    main()
