"""`pip install ./python` packaging: the wheel bundles the built libpagoda next to the package,
and the installed package works from anywhere (no checkout on the path)."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT.parent / "shared" / "testdata" / "models" / "stories260K.gguf"


def built_library():
    if os.environ.get("PAGODA_BIN"):
        lib = Path(os.environ["PAGODA_BIN"]).parent / "libpagoda.so"
    else:
        lib = ROOT / "build" / "libpagoda.so"
    if not lib.is_file():
        pytest.skip(f"no built library at {lib}")
    return lib


def test_wheel_bundles_library_and_runs(tmp_path):
    lib = built_library()
    env = dict(os.environ, PAGODA_LIBRARY=str(lib))
    # setuptools is in the test venv: build without network access
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT / "python")], check=True, env=env)
    wheels = list((tmp_path / "dist").glob("pagoda-*.whl"))
    assert len(wheels) == 1
    site = tmp_path / "site"
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
        assert "pagoda/libpagoda.so" in names and "pagoda/runner.py" in names
        z.extractall(site)
    assert (site / "pagoda" / "libpagoda.so").read_bytes() == lib.read_bytes()
    env = {k: v for k, v in os.environ.items() if k not in ("PAGODA_LIBRARY", "PYTHONPATH")}
    code = ("import pagoda, pagoda._ffi as f; f.lib(); print(f._lib._name); "
            f"r = pagoda.Runner(model={str(MODEL)!r}, device='cpu', threads=2, pa_memory_mb=8); "
            "print(r.generate('Once upon a time', pagoda.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text)")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=dict(env, PYTHONPATH=str(site)),
                         check=True, capture_output=True, text=True).stdout.splitlines()
    assert out[0] == str(site / "pagoda" / "libpagoda.so")
    assert out[1] == ", there was a little girl"


def test_missing_library_is_a_clear_error(tmp_path):
    env = dict(os.environ, PAGODA_LIBRARY=str(tmp_path / "nope.so"), PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", "import pagoda; pagoda.Runner()"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "error: PAGODA_LIBRARY=" in r.stderr and "nope.so" in r.stderr


def test_import_from_checkout_root():
    """`python -c "import pagoda; pagoda.Runner()..."` from the repository root, nothing
    installed: the root pagoda/ points at python/pagoda and build/libpagoda.so."""
    lib = built_library()
    if lib.parent != ROOT / "build":
        pytest.skip("the library is not in the checkout's build/")
    env = {k: v for k, v in os.environ.items() if k not in ("PAGODA_LIBRARY", "PYTHONPATH")}
    env["PAGODA_MODEL"] = str(MODEL)
    code = ("import pagoda; r = pagoda.Runner(device='cpu', threads=2, pa_memory_mb=8); "
            "print(r.send_completion_request(pagoda.CompletionRequest(prompt='Once upon a time', "
            "max_tokens=8, temperature=0)).choices[0].text)")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out == ", there was a little girl\n"
