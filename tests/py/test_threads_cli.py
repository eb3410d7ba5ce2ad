"""test_threads_cli.py - the CPU backend does not busy-wait: the command starts OpenMP with a short
spin count (GOMP_SPINCOUNT 10000, then a futex sleep) unless the user chose a wait policy."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "models" / "stories260K.gguf"

needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"shared test data absent: {MODEL}")
BENCH = ["bench", "-m", str(MODEL), "--device", "cpu", "--num-prompts", "2", "--input-len", "8",
         "--output-len", "4"]


def spincounts(extra_env):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra_env, OMP_DISPLAY_ENV="verbose")
    r = subprocess.run([BIN, *BENCH], capture_output=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    return re.findall(r"GOMP_SPINCOUNT = '(\d+)'", r.stderr.decode())


@needs_model
def test_default_spin_is_short():
    # libgomp prints its settings when it starts; the last start is the one that runs the model.
    assert spincounts({})[-1] == "10000"


@needs_model
def test_user_wait_policy_is_kept():
    assert spincounts({"GOMP_SPINCOUNT": "123"}) == ["123"]
    assert spincounts({"OMP_WAIT_POLICY": "active"})[-1] != "10000"

