"""serve_util.py - starts `pagoda serve` on a free loopback port for the serve tests."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "models" / "stories260K.gguf"
GREEDY = TESTDATA / "models" / "stories260K.greedy.jsonl"
QWEN_TEMPLATE = TESTDATA / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"


class Server:
    """A running `pagoda serve`; .url is its base URL; stop() sends SIGTERM and returns the exit code."""

    def __init__(self, *extra, binary=BIN, env=None, log_path=None, model=MODEL):
        args = [binary, "serve", "-m", str(model), "--device", "cpu", "--threads", "1",
                "--pa-memory-mb", "16", "--port", "0", "--served-model-name", "stories",
                "--chat-template", str(QWEN_TEMPLATE), *extra]
        self.log_path = log_path
        self.log = open(log_path, "w+b") if log_path else subprocess.PIPE
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log,
                                     env={**os.environ, **(env or {})})
        self.url = None
        self.stderr_lines = []
        deadline = time.time() + 120
        while time.time() < deadline and self.url is None:
            line = self._readline()
            if line is None:
                if self.proc.poll() is not None:
                    raise RuntimeError("pagoda serve exited: " + "".join(self.stderr_lines))
                time.sleep(0.05)
                continue
            self.stderr_lines.append(line)
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                self.url = m.group(1)
        if self.url is None:
            self.proc.kill()
            raise RuntimeError("pagoda serve did not start: " + "".join(self.stderr_lines))

    def _readline(self):
        if self.log_path:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines(True)
            if len(lines) > len(self.stderr_lines):
                return lines[len(self.stderr_lines)]
            return None
        return self.proc.stderr.readline().decode(errors="replace") or None

    @property
    def pid(self):
        return self.proc.pid

    def rss_kib(self):
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout)
        if not self.log_path:
            self.stderr_lines.append(self.proc.stderr.read().decode(errors="replace"))
        return rc

    def stderr(self):
        if self.log_path:
            return Path(self.log_path).read_text(errors="replace")
        return "".join(self.stderr_lines)


def http(url, body=None, method=None, headers=None, timeout=60):
    """Returns (status, parsed JSON or text)."""
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    if "json" in ctype:
        return status, json.loads(raw)
    return status, raw.decode(errors="replace")


def metrics(url):
    status, text = http(url + "/metrics")
    assert status == 200
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
