#!/usr/bin/env bash
# setup.sh - installs what pagoda needs on Debian 12: the build's Debian packages and, with
# --test, a Python virtual environment (.venv) holding the test tools. Idempotent and quick
# when everything is already there.
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
