"""The CLI at the library boundary (issue 8, items 7-8): the CUDA backend is a module loaded only
for the cuda device, `--device cuda` without a usable GPU (or without the module) says so plainly,
`pagoda tokenize` loads no CUDA library, and `render-template --help` is help, not a usage error.
(tests/check_boundary.sh checks the built artifacts: exported symbols and ldd.)"""
import re
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
DATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = DATA / "models" / "stories260K.gguf"
MODULE_BESIDE = Path(BIN).resolve().parent / "libpagoda-cuda.so"
HAVE_GPU = Path("/dev/nvidia0").exists()

needs_model = pytest.mark.skipif(not MODEL.exists(), reason="shared test data absent")


def run(args, env=None, stdin=b""):
    e = dict(os.environ)
    e.pop("PAGODA_BACKEND_PATH", None)
    e.update(env or {})
    return subprocess.run([BIN, *args], input=stdin, capture_output=True, timeout=120, env=e)


def assert_plain_device_error(r):
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert r.stdout == b""
    assert err.startswith("error: --device cuda: "), err
    assert err.rstrip().endswith("use --device cpu"), err
    assert "cudaError" not in err and "CUDA error" not in err and ".cu:" not in err, err
    return err


@needs_model
@pytest.mark.skipif(HAVE_GPU, reason="a GPU is present")
def test_device_cuda_without_gpu_says_so():
    err = assert_plain_device_error(run(["run", "-m", str(MODEL), "--device", "cuda", "-p", "hi", "-n", "2"]))
    if MODULE_BESIDE.exists():  # the module loads; the machine has no usable GPU
        assert "no usable GPU: " in err
    else:  # no module: every place tried is named
        assert f"tried {MODULE_BESIDE} (not found)" in err and "PAGODA_BACKEND_PATH" in err


@needs_model
@pytest.mark.skipif(MODULE_BESIDE.exists(), reason="the module beside the binary is found first")
def test_backend_path_search_names_what_was_tried(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "libpagoda-cuda.so").write_bytes(b"not an ELF file")
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PAGODA_BACKEND_PATH": f"{empty}:{bad}"}
    err = assert_plain_device_error(run(["run", "-m", str(MODEL), "--device", "cuda", "-p", "hi"], env))
    tried = err[err.index("tried "):]
    # in search order: beside the binary, then each PAGODA_BACKEND_PATH entry, with the reason
    assert tried.index(str(MODULE_BESIDE)) < tried.index(str(empty)) < tried.index(str(bad))
    assert f"{empty}/libpagoda-cuda.so (not found)" in err
    assert f"{bad}/libpagoda-cuda.so (" in err and f"{bad}/libpagoda-cuda.so (not found)" not in err
    assert f"PAGODA_BACKEND_PATH (directories holding it) is {empty}:{bad}" in err


@needs_model
def test_cpu_and_auto_device_need_no_module(tmp_path):
    # auto (no --device) falls back to the CPU when there is no module or no GPU
    r = run(["run", "-m", str(MODEL), "-p", "Once upon a time", "-n", "4", "--temperature", "0"],
            {"PAGODA_BACKEND_PATH": str(tmp_path), "PAGODA_LOG": "debug"})
    assert r.returncode == 0, r.stderr
    if not HAVE_GPU:
        assert b"device: cpu (no cuda: " in r.stderr
    r = run(["run", "-m", str(MODEL), "--device", "cpu", "-p", "Once upon a time", "-n", "4", "--temperature", "0"])
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


@needs_model
def test_tokenize_loads_no_cuda_library():
    r = run(["tokenize", "-m", str(MODEL)], {"LD_DEBUG": "files"}, b"Once upon a time")
    assert r.returncode == 0
    loaded = [l for l in r.stderr.decode(errors="replace").splitlines() if "file=" in l]
    assert loaded, "LD_DEBUG printed nothing"
    assert not [l for l in loaded if re.search(r"libcuda|libcudart|libcublas|pagoda-cuda", l)], loaded


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_render_template_help_is_not_a_usage_error(flag):
    r = run(["render-template", flag])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"usage: pagoda render-template [--error-location] TEMPLATE.jinja CONTEXT.json")
    assert r.stderr == b""


def _cudart():
    r = subprocess.run(["ldd", str(MODULE_BESIDE)], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if "libcudart.so" in line and "=> /" in line:
            return line.split("=>")[1].split()[0]
    return None


@needs_model
@pytest.mark.skipif(not MODULE_BESIDE.exists(), reason="this build made no CUDA module")
def test_runs_without_the_cuda_runtime():
    """A machine without the CUDA libraries, simulated in a private mount namespace (needs root):
    the CUDA runtime the module links is replaced by an empty file there."""
    cudart = _cudart()
    if not cudart:
        pytest.skip("the module's libcudart is not found")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare -m is not permitted here")
    script = (f'mount --bind /dev/null {cudart} || exit 99; '
              f'"{BIN}" run -m "{MODEL}" -p "Once upon a time" -n 4 --temperature 0 >/dev/null 2>&1 || exit 10; '
              f'echo Hello | "{BIN}" tokenize -m "{MODEL}" >/dev/null 2>&1 || exit 11; '
              f'"{BIN}" run -m "{MODEL}" --device cuda -p hi')
    r = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, timeout=120)
    if r.returncode == 99:
        pytest.skip("bind mounts are not permitted here")
    assert r.returncode not in (10, 11), r.stderr  # the CPU path and tokenize work without CUDA
    err = assert_plain_device_error(r)
    assert "the CUDA backend cannot be loaded" in err and "libcudart" in err
    assert "the CUDA runtime libraries are not installed" in err
