"""test_serve_page.py - the chat page at / in headless Chromium (Debian `chromium`): the page
streams an answer from /v1/chat/completions into the DOM; it equals the API's own greedy answer
for the same conversation. A screenshot is saved in the test's output directory."""
import html
import re
import shutil
import subprocess
import urllib.parse

import pytest

from serve_util import MODEL, QWEN_TEMPLATE, Server, http

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.skipif(not CHROMIUM, reason="chromium not installed (scripts/setup.sh --test)"),
              pytest.mark.skipif(not MODEL.exists() or not QWEN_TEMPLATE.exists(), reason="shared test data absent")]


def chromium(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--window-size=1000,700", "--virtual-time-budget=60000", *args],
                          capture_output=True, timeout=120)


def test_chat_page_streams_answer(tmp_path):
    s = Server(log_path=tmp_path / "page.log")
    try:
        q = {"q": "Tell me a story", "system": "You are a storyteller.", "max_tokens": "24", "temperature": "0"}
        url = s.url + "/?" + urllib.parse.urlencode(q)
        # headless Chromium may dump the DOM while the answer is still streaming (its virtual
        # clock does not always wait for an open fetch on a loaded machine): a dump without the
        # finished answer is retried with a fresh browser, at most three times.
        for _ in range(3):
            r = chromium("--dump-dom", url)
            dom = r.stdout.decode()
            m = re.search(r'<div class="msg assistant" id="answer-1" data-done="1">(.*?)</div>', dom, re.S)
            if m:
                break
        assert m, dom[-2000:]
        answer = html.unescape(m.group(1))
        status, ref = http(s.url + "/v1/chat/completions", {
            "messages": [{"role": "system", "content": q["system"]}, {"role": "user", "content": q["q"]}],
            "max_tokens": 24, "temperature": 0})
        assert status == 200 and answer == ref["choices"][0]["message"]["content"] and answer
        shot = tmp_path / "chat_page.png"
        chromium(f"--screenshot={shot}", url)
        assert shot.exists() and shot.stat().st_size > 5000
        print(f"screenshot: {shot}")
    finally:
        assert s.stop() == 0
