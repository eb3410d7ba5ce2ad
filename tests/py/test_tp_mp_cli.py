"""test_tp_mp_cli.py - multi-process tensor parallelism through the CLI, torchrun-style: the same
`pagoda run` / `bench` command line started once per rank (--tp-rank R --tp-world 2 --tp-master,
or PAGODA_TP_* for the worker) on the CPU backend gives the text / output digest of --tp 1 and
--tp 2; the worker exits 0 when rank 0's command ends; bad rank flags are usage errors. The engine
side (4 processes, lost ranks, refusals) is tests/c/test_engine_mp.c."""
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "models" / "stories260K.gguf"

needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"shared test data absent: {MODEL}")

BASE = ["-m", str(MODEL), "--device", "cpu", "--threads", "1", "--max-model-len", "256"]


def free_master():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def two_processes(cmd, args, worker_env=False):
    """Runs `pagoda CMD ARGS` as rank 1 (flags, or PAGODA_TP_* when WORKER_ENV) and rank 0."""
    master = free_master()
    env = dict(os.environ, PAGODA_TP_TIMEOUT="30")
    wenv = dict(env)
    if worker_env:
        wenv.update(PAGODA_TP_RANK="1", PAGODA_TP_WORLD="2", PAGODA_TP_MASTER=master)
        wflags = []
    else:
        wflags = ["--tp-rank", "1", "--tp-world", "2", "--tp-master", master]
    worker = subprocess.Popen([BIN, cmd, *BASE, *args, *wflags], env=wenv, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        r0 = subprocess.run([BIN, cmd, *BASE, *args, "--tp-rank", "0", "--tp-world", "2", "--tp-master", master],
                            env=env, capture_output=True, timeout=60)
        wout, werr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert r0.returncode == 0, r0.stderr.decode()
    assert worker.returncode == 0, werr.decode()
    assert wout == b"", "a worker prints nothing on stdout"
    assert "tensor-parallel rank 1 of 2" in werr.decode()
    return r0


def single(cmd, args, tp):
    r = subprocess.run([BIN, cmd, *BASE, *args, "--tp", str(tp)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    return r


@needs_model
@pytest.mark.parametrize("worker_env", [False, True])
def test_run_two_processes_equal_tp1_tp2(worker_env):
    args = ["--raw", "-p", "Once upon a time", "--temperature", "0", "-n", "48"]
    mp = two_processes("run", args, worker_env).stdout
    assert mp and mp == single("run", args, 1).stdout == single("run", args, 2).stdout


@needs_model
def test_bench_two_processes_digest_equal_tp2():
    """Seeded sampling over 16 parallel requests: the same output digest as --tp 2 and --tp 1."""
    args = ["--num-prompts", "16", "--input-len", "40", "--output-len", "24", "--max-num-seqs", "16",
            "--temperature", "0.8", "--seed", "3", "--json"]
    digest = lambda r: json.loads(r.stdout)["output_digest"]
    d = digest(two_processes("bench", args))
    assert d == digest(single("bench", args, 2)) == digest(single("bench", args, 1))


@needs_model
@pytest.mark.parametrize("flags,msg", [
    (["--tp-rank", "1"], "--tp-rank 1: must be below --tp-world 1"),
    (["--tp-world", "2"], "--tp-master"),
    (["--tp-world", "2", "--tp-master", "127.0.0.1:1", "--tp", "2"], "--tp 2 with --tp-world 2"),
    (["--tp-master", "nocolon"], "--tp-master expects host:port"),
])
def test_bad_rank_flags(flags, msg):
    r = subprocess.run([BIN, "run", *BASE, "-p", "x", "-n", "1", *flags], capture_output=True, timeout=30)
    assert r.returncode in (1, 2)
    assert msg in r.stderr.decode() and r.stderr.decode().startswith("error:"), r.stderr.decode()
