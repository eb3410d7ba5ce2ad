"""test_run_session.py - `pagoda run` / `bench` process behaviour (issue 8, items 2-6) on
stories260K: a chat that outgrows the context goes on, Ctrl-C stops a reply (chat) or a -p run
with its timing line, long prompts from -f FILE and -p - (stdin), multi-line chat messages,
write failures exit 1, and the error / exit-code / --help conventions of docs/cli.md."""
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "models" / "stories260K.gguf"
DOCS = ROOT / "docs" / "cli.md"

needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"shared test data absent: {MODEL}")
TIMING = re.compile(r"(interrupted; )?prompt: (\d+) tokens in [\d.]+ s \([\d.]+ tokens/s\); "
                    r"generation: (\d+) tokens in [\d.]+ s \([\d.]+ tokens/s\)")


def pagoda(*args, stdin=b"", timeout=120, stdout=subprocess.PIPE):
    return subprocess.run([BIN, *args], input=stdin, stdout=stdout, stderr=subprocess.PIPE, timeout=timeout)


def timings(stderr):
    return TIMING.findall(stderr.decode())


def n_tokens(text):
    r = pagoda("tokenize", "-m", str(MODEL), "--add-special", stdin=text.encode())
    assert r.returncode == 0, r.stderr.decode()
    return len(r.stdout.split())


# -- 2. a chat that outgrows the context -----------------------------------------------------

@needs_model
def test_chat_drops_oldest_turns_when_context_is_full():
    # greedy replies run to the end of the context (-n -1): the second message cannot be added
    # to the conversation, so the first turn goes, with a note; the session still answers
    r = pagoda("run", "-m", str(MODEL), "--temperature", "0", "--max-model-len", "256",
               stdin=b"Once upon a time\nThe cat\n")
    assert r.returncode == 0, r.stderr.decode()
    err = r.stderr.decode()
    assert "note: the conversation outgrew the context (256 tokens): dropped the 1 oldest turn" in err
    t = timings(r.stderr)
    assert len(t) == 2
    assert int(t[1][1]) == n_tokens("The cat")  # the second turn alone
    assert int(t[0][2]) > 200  # the first reply filled the context


@needs_model
def test_chat_refuses_a_message_that_cannot_fit_and_goes_on():
    long_msg = b"Once upon a time " * 40  # > 64 tokens
    r = pagoda("run", "-m", str(MODEL), "--temperature", "0", "--max-model-len", "64", "-n", "4",
               stdin=b"Once upon a time\n" + long_msg + b"\nThe dog\n")
    assert r.returncode == 0, r.stderr.decode()
    err = r.stderr.decode()
    assert re.search(r"error: this message needs \d+ tokens plus -n, more than the context of 64 "
                     r"\(--max-model-len\): not sent", err)
    assert len(timings(r.stderr)) == 2  # first and third messages answered
    assert r.stdout.decode().count("\n") == 3


# -- 3. Ctrl-C --------------------------------------------------------------------------------

class Proc:
    """A running pagoda with its stdout/stderr collected by threads."""

    def __init__(self, *args):
        self.p = subprocess.Popen([BIN, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        self.out, self.err = bytearray(), bytearray()
        for src, dst in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        while True:
            b = src.read1(4096)
            if not b:
                return
            dst += b

    def wait_for(self, pred, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return True
            if self.p.poll() is not None:
                return pred()
            time.sleep(0.01)
        return False

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@needs_model
def test_ctrl_c_stops_a_prompt_run_and_prints_timing():
    # --ignore-eos: the reply would run to the end of the 2048-token context
    pr = Proc("run", "-m", str(MODEL), "-p", "Once upon a time", "--raw", "--ignore-eos", "--temperature", "0")
    try:
        assert pr.wait_for(lambda: len(pr.out) > 20)
        pr.p.send_signal(signal.SIGINT)
        assert pr.p.wait(timeout=30) == 130
        pr.wait_for(lambda: b"prompt: " in pr.err, 5)
        t = timings(bytes(pr.err))
        assert len(t) == 1 and t[0][0] == "interrupted; "
        assert 0 < int(t[0][2]) < 2000
    finally:
        pr.close()


@needs_model
def test_ctrl_c_in_chat_returns_to_prompt_then_exits_at_empty_prompt():
    pr = Proc("run", "-m", str(MODEL), "--ignore-eos", "--temperature", "0")
    try:
        pr.p.stdin.write(b"Once upon a time\n")
        pr.p.stdin.flush()
        assert pr.wait_for(lambda: len(pr.out) > 20)
        pr.p.send_signal(signal.SIGINT)
        # the reply stops, its timing line is printed, and the prompt comes back
        assert pr.wait_for(lambda: re.search(rb"interrupted; prompt: .*\n> $", bytes(pr.err), re.S)), bytes(pr.err)
        assert pr.p.poll() is None
        # the session goes on: a second message gets a (short) reply
        n = len(pr.out)
        pr.p.stdin.write(b"The dog\n")
        pr.p.stdin.flush()
        assert pr.wait_for(lambda: len(pr.out) > n + 20)
        pr.p.send_signal(signal.SIGINT)
        assert pr.wait_for(lambda: bytes(pr.err).count(b"interrupted; prompt: ") == 2 and
                           bytes(pr.err).endswith(b"> "))
        # Ctrl-C at an empty prompt ends the chat
        pr.p.send_signal(signal.SIGINT)
        assert pr.p.wait(timeout=30) == 0
    finally:
        pr.close()


# -- 4. long prompts, multi-line messages -----------------------------------------------------

@needs_model
def test_prompt_from_file_and_stdin(tmp_path):
    base = ["run", "-m", str(MODEL), "--raw", "--temperature", "0", "-n", "16"]
    ref = pagoda(*base, "-p", "Once upon a time")
    assert ref.returncode == 0
    f = tmp_path / "prompt.txt"
    f.write_text("Once upon a time")
    for r in (pagoda(*base, "-f", str(f)), pagoda(*base, "--file", str(f)),
              pagoda(*base, "-p", "-", stdin=b"Once upon a time")):
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout == ref.stdout
    # longer than the 128 KiB limit of one argument: read in full (and rejected by its length,
    # which is the whole file's)
    big = "Once upon a time " * 9000
    f.write_text(big)
    for r in (pagoda(*base, "-f", str(f)), pagoda(*base, "-p", "-", stdin=big.encode())):
        assert r.returncode == 1
        assert f"the prompt ({n_tokens(big)} tokens)".encode() in r.stderr
    r = pagoda(*base, "-f", str(tmp_path / "absent.txt"))
    assert r.returncode == 1 and r.stderr.startswith(b"error: ") and b"absent.txt" in r.stderr
    r = pagoda(*base, "-f", str(f), "-p", "x")
    assert r.returncode == 2 and r.stderr.startswith(b"error: ")


@needs_model
def test_multi_line_chat_messages():
    base = ["run", "-m", str(MODEL), "--temperature", "0", "-n", "4"]
    text = "Once upon a time\nthere was\na dog"
    for stdin in (b"Once upon a time\\\nthere was\\\na dog\n", b'"""\nOnce upon a time\nthere was\na dog\n"""\n'):
        r = pagoda(*base, stdin=stdin)
        assert r.returncode == 0, r.stderr.decode()
        t = timings(r.stderr)
        assert len(t) == 1 and int(t[0][1]) == n_tokens(text), (stdin, t)


# -- 5. write failures -------------------------------------------------------------------------

@needs_model
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_write_failures_exit_1():
    with open("/dev/full", "wb") as full:
        r = pagoda("run", "-m", str(MODEL), "-p", "Once upon a time", "--raw", "-n", "8", stdout=full)
        assert r.returncode == 1 and b"error: cannot write the output to stdout" in r.stderr
        r = pagoda("bench", "-m", str(MODEL), "--num-prompts", "2", "--input-len", "8", "--output-len", "4",
                   "--json", stdout=full)
        assert r.returncode == 1 and b"error: cannot write the results to stdout" in r.stderr
        r = pagoda("run", "-m", str(MODEL), "--temperature", "0", "-n", "4", stdin=b"Once\n", stdout=full)
        assert r.returncode == 1 and b"error: cannot write the output to stdout" in r.stderr


# -- 6. consistency ----------------------------------------------------------------------------

@needs_model
@pytest.mark.parametrize("args,code", [
    (["run", "-m", str(MODEL), "-p", "hi", "--pa-memory-mb", "8", "--pa-memory-fraction", "0.5"], 2),
    (["bench", "-m", str(MODEL), "--pa-context-len", "64", "--pa-memory-fraction", "0.5"], 2),
    (["bench", "-m", str(MODEL), "--shared-prefix-len", "100", "--input-len", "64"], 2),
    (["bench", "-m", str(MODEL), "--shared-prefix-len", "64", "--input-len", "64"], 2),
    (["run", "-m", "/nonexistent.gguf", "-p", "hi"], 1),
    (["run", "-m", str(MODEL), "-p", "hi", "--bogus"], 2),
    (["tokenize"], 2),
    (["tokenize", "-m", "/nonexistent.gguf"], 1),
    (["detokenize", "--bogus"], 2),
    (["render-template", "a"], 2),
    (["render-template", "/nonexistent.jinja", "/nonexistent.json"], 1),
    (["no-such-command"], 2),
    ([], 2),
])
def test_errors_start_with_error_and_exit_codes(args, code):
    r = pagoda(*args)
    assert r.returncode == code, r.stderr.decode()
    lines = [l for l in r.stderr.decode().splitlines() if not l.startswith("[pagoda")]
    assert lines and lines[0].startswith("error: "), r.stderr.decode()


def help_default(cmd, flag):
    r = pagoda(cmd, "--help")
    assert r.returncode == 0 and not r.stderr
    m = re.search(re.escape(flag) + r"\b[^\n]*\(default (-?[\d.]+)", r.stdout.decode())
    assert m, (cmd, flag)
    return m.group(1)


def test_help_defaults_are_the_parsers():
    assert help_default("run", "--max-num-seqs") == "16"
    assert help_default("bench", "--max-num-seqs") == "256"
    assert help_default("run", "--prefix-cache-n") == "16"
    assert help_default("bench", "--num-prompts") == "64"
    assert re.search(r"--temperature T.*default 0\.8", pagoda("run", "--help").stdout.decode())
    r = pagoda("render-template", "--help")
    assert r.returncode == 0 and b"usage: pagoda render-template" in r.stdout and not r.stderr


@needs_model
def test_help_max_num_seqs_is_what_run_uses():
    r = pagoda("run", "-m", str(MODEL), "-p", "hi", "--raw", "-n", "1")
    assert r.returncode == 0
    assert "(8192 tokens, 16 sequences)" in r.stderr.decode()


@needs_model
def test_docs_examples_match_output():
    doc = DOCS.read_text()
    blocks = re.findall(r"```\n(.*?)```", doc, re.S)
    timing = next(b for b in blocks if b.startswith("prompt: ")).strip()
    assert TIMING.fullmatch(timing), timing
    r = pagoda("run", "-m", str(MODEL), "-p", "Once upon a time", "--raw", "-n", "64", "--temperature", "0")
    assert r.returncode == 0
    assert any(TIMING.fullmatch(l) for l in r.stderr.decode().splitlines())
    # the impossible-budget example: the same message, numbers included
    budget = next(b for b in blocks if b.startswith("error: the KV budget")).replace("\n", " ").strip()
    r = pagoda("run", "-m", str(MODEL), "-p", "hi", "--pa-memory-mb", "1", "--device", "cpu")
    assert r.returncode == 1
    assert budget in r.stderr.decode().replace("\n", " ")
    # the start-up log lines quoted in the text
    r = pagoda("run", "-m", str(MODEL), "-p", "hi", "-n", "1", "--pa-memory-mb", "3", "--device", "cpu")
    err = r.stderr.decode()
    for quoted in re.findall(r"`((?:memory|KV pool): [^`]*)`", doc.replace("\n", " ")):
        head = quoted.split("(...)")[0].strip()
        assert head in err, head
