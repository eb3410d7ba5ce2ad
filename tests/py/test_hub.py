"""test_hub.py - `-m org/name`: models by Hugging Face repo id, through the huggingface_hub cache
layout and downloads from a hub on loopback (tests/py/hub_server.py serves fixture repos in the
hub's URL layout). The cache written is checked with the real huggingface_hub package in both
directions (it reads pagoda's downloads; pagoda reads its downloads)."""
import hashlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from hub_server import Hub, Repo, git_blob_id

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
FIX = ROOT / "tests" / "fixtures"
GGUF = TESTDATA / "models" / "stories260K.gguf"
PHI2 = TESTDATA / "tokenizers" / "phi-2"
PHI3 = TESTDATA / "tokenizers" / "phi-3-mini"
SPM_VOCAB = TESTDATA / "vocab" / "ggml-vocab-llama-spm.gguf"

pytestmark = pytest.mark.skipif(not (GGUF.exists() and PHI2.exists() and PHI3.exists() and SPM_VOCAB.exists()),
                                reason=f"shared test data absent: {TESTDATA}")
TOKEN = "hf_test_secret_token"
TEXT = "Hello world, this is pagoda."


def files_of(*dirs, skip=("logits.bin", "tokens.json", "vocab-test.out")):
    out = {}
    for d in dirs:
        for p in sorted(Path(d).iterdir()):
            if p.is_file() and p.name not in skip:
                out[p.name] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def hub():
    with Hub() as h:
        llama = Repo()
        h.llama_main = llama.add_commit({**files_of(FIX / "llama", PHI2), "README.md": b"# tiny\n",
                                         "logits.bin": b"\0" * 64}, refs=("main",))
        h.llama_v1 = llama.add_commit(files_of(FIX / "llama", PHI3), refs=("v1",))
        h.repos["tester/llama"] = llama
        sharded = Repo()
        sharded.add_commit(files_of(FIX / "llama_sharded", PHI2))
        h.repos["tester/sharded"] = sharded
        stories = Repo()
        stories.add_commit({"stories260K.gguf": GGUF.read_bytes(), "vocab-spm.gguf": SPM_VOCAB.read_bytes(),
                            "README.md": b"# stories\n"})
        h.repos["tester/stories"] = stories
        single = Repo()
        single.add_commit({"stories260K.gguf": GGUF.read_bytes()})
        h.repos["tester/stories-one"] = single
        resume = Repo()
        resume.add_commit({"stories260K.gguf": GGUF.read_bytes()})
        h.repos["tester/resume"] = resume
        gated = Repo(gated=True)
        gated.add_commit({"stories260K.gguf": GGUF.read_bytes()})
        h.repos["tester/gated"] = gated
        private = Repo(token=TOKEN)
        private.add_commit({"stories260K.gguf": GGUF.read_bytes()})
        h.repos["tester/private"] = private
        yield h


def env_for(tmp, hub=None, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_", "HUGGING_FACE_", "XDG_CACHE"))}
    env["HOME"] = str(tmp / "home")
    env["HF_HOME"] = str(tmp / "hf")
    env["HF_HUB_CACHE"] = str(tmp / "cache")
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    env.update({k: str(v) for k, v in extra.items()})
    return env


def pagoda(*args, env, cwd=None, stdin=b"", timeout=120):
    r = subprocess.run([BIN, *args], input=stdin, capture_output=True, env=env, cwd=cwd, timeout=timeout)
    assert b"Sanitizer" not in r.stderr, r.stderr.decode()  # an ASan build as PAGODA_BIN: no leak on any path
    return r


def tokenize(model, env, *extra):
    r = pagoda("tokenize", "-m", str(model), *extra, env=env, stdin=TEXT.encode())
    return r


def repo_dir(tmp, repo):
    return tmp / "cache" / ("models--" + repo.replace("/", "--"))


def check_snapshot_file(tmp, repo, sha, name, data):
    """The file is a relative symlink to blobs/<etag>, etag as huggingface_hub names it."""
    rd = repo_dir(tmp, repo)
    p = rd / "snapshots" / sha / name
    assert p.is_symlink(), p
    lfs = name.endswith((".safetensors", ".gguf"))
    etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_id(data)
    assert os.readlink(p) == "../../blobs/" + etag
    assert (rd / "blobs" / etag).read_bytes() == data


def test_download_safetensors_layout_read_by_huggingface_hub(hub, tmp_path):
    env = env_for(tmp_path, hub)
    r = tokenize("tester/llama", env)
    assert r.returncode == 0, r.stderr.decode()
    ref = tokenize(PHI2 / "tokenizer.json", env_for(tmp_path))
    assert ref.returncode == 0 and r.stdout == ref.stdout
    assert b"downloading tester/llama/model.safetensors" in r.stderr
    assert b"  tester/llama/model.safetensors: 0.4 / 0.4 MiB (100%)\n" in r.stderr  # progress, not a tty
    rd = repo_dir(tmp_path, "tester/llama")
    assert (rd / "refs" / "main").read_text() == hub.llama_main
    snap = rd / "snapshots" / hub.llama_main
    files = hub.repos["tester/llama"].commits[hub.llama_main]
    want = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert {p.name for p in snap.iterdir()} == want  # README.md and logits.bin are not fetched
    for name in want:
        check_snapshot_file(tmp_path, "tester/llama", hub.llama_main, name, files[name])
    assert not list((rd / "blobs").glob("*.incomplete"))

    from huggingface_hub import hf_hub_download
    for name in want:
        p = hf_hub_download("tester/llama", name, cache_dir=str(tmp_path / "cache"), local_files_only=True)
        assert Path(p) == snap / name and Path(p).read_bytes() == files[name]

    # the engine runs on it (bench: random ids, so the tokenizer's vocabulary does not matter),
    # and the second use downloads nothing
    before = len(hub.requests("/resolve/"))
    b = pagoda("bench", "-m", "tester/llama", "--device", "cpu", "--num-prompts", "2", "--input-len", "8",
               "--output-len", "4", env=env)
    assert b.returncode == 0, b.stderr.decode()
    assert len(hub.requests("/resolve/")) == before


def test_download_sharded_safetensors(hub, tmp_path):
    env = env_for(tmp_path, hub)
    b = pagoda("bench", "-m", "tester/sharded", "--device", "cpu", "--num-prompts", "2", "--input-len", "8",
               "--output-len", "4", env=env)
    assert b.returncode == 0, b.stderr.decode()
    repo = hub.repos["tester/sharded"]
    sha = repo.refs["main"]
    for name in ("model.safetensors.index.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors", "config.json"):
        check_snapshot_file(tmp_path, "tester/sharded", sha, name, repo.commits[sha][name])


def test_gguf_selection_and_run(hub, tmp_path):
    env = env_for(tmp_path, hub)
    args = ["run", "--device", "cpu", "-p", "Once upon a time", "--raw", "--temperature", "0", "-n", "24"]
    r = pagoda(*args, "-m", "tester/stories", env=env)
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.startswith("error:") and "--hf-file" in err and "stories260K.gguf" in err and "vocab-spm.gguf" in err
    local = pagoda(*args, "-m", str(GGUF), env=env)
    assert local.returncode == 0, local.stderr.decode()
    r = pagoda(*args, "-m", "tester/stories", "--hf-file", "stories260K.gguf", env=env)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == local.stdout and r.stdout
    sha = hub.repos["tester/stories"].refs["main"]
    snap = repo_dir(tmp_path, "tester/stories") / "snapshots" / sha
    assert [p.name for p in snap.iterdir()] == ["stories260K.gguf"]
    # a repo with one GGUF needs no --hf-file
    r = pagoda(*args, "-m", "tester/stories-one", env=env)
    assert r.returncode == 0 and r.stdout == local.stdout, r.stderr.decode()
    # a file the repo lacks
    r = pagoda(*args, "-m", "tester/stories", "--hf-file", "nope.gguf", env=env)
    assert r.returncode == 1 and b"nope.gguf is not a file of tester/stories" in r.stderr


def test_revision(hub, tmp_path):
    env = env_for(tmp_path, hub)
    r = tokenize("tester/llama", env, "--revision", "v1")
    ref = tokenize(PHI3 / "tokenizer.json", env_for(tmp_path))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == ref.stdout
    d = pagoda("detokenize", "-m", "tester/llama", "--revision", "v1", env=env, stdin=r.stdout)
    assert d.returncode == 0 and d.stdout.decode() == TEXT, d.stderr.decode()
    assert r.stdout != tokenize(PHI2 / "tokenizer.json", env_for(tmp_path)).stdout
    rd = repo_dir(tmp_path, "tester/llama")
    assert (rd / "refs" / "v1").read_text() == hub.llama_v1
    assert not (rd / "refs" / "main").exists()
    # a commit sha as the revision: no refs file; then offline, by sha and by the tag
    r = tokenize("tester/llama", env, "--revision", hub.llama_main)
    assert r.returncode == 0 and not (rd / "refs" / "main").exists()
    assert (rd / "snapshots" / hub.llama_main / "tokenizer.json").exists()
    off = env_for(tmp_path, hub, HF_HUB_OFFLINE=1)
    assert tokenize("tester/llama", off, "--revision", hub.llama_main).stdout == \
        tokenize(PHI2 / "tokenizer.json", off).stdout
    assert tokenize("tester/llama", off, "--revision", "v1").stdout == ref.stdout
    r = tokenize("tester/llama", env, "--revision", "no-such-branch")
    assert r.returncode == 1 and b"revision 'no-such-branch' not found" in r.stderr and b"--revision" in r.stderr


def test_cache_written_by_huggingface_hub(hub, tmp_path):
    """huggingface_hub downloads from the same server; pagoda finds its cache offline (refs/main)."""
    from huggingface_hub import hf_hub_download
    cache = tmp_path / "cache"
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        hf_hub_download("tester/llama", name, cache_dir=str(cache), endpoint=hub.url)
    rd = repo_dir(tmp_path, "tester/llama")
    assert (rd / "refs" / "main").read_text() == hub.llama_main
    before = len(hub.requests())
    env = env_for(tmp_path, hub, HF_HUB_OFFLINE=1)
    r = tokenize("tester/llama", env)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == tokenize(PHI2 / "tokenizer.json", env).stdout
    b = pagoda("bench", "-m", "tester/llama", "--device", "cpu", "--num-prompts", "1", "--input-len", "8",
               "--output-len", "2", env=env)
    assert b.returncode == 0, b.stderr.decode()
    assert len(hub.requests()) == before  # offline: no request at all
    # online, it links the files huggingface_hub already has and downloads nothing
    r = tokenize("tester/llama", env_for(tmp_path, hub))
    assert r.returncode == 0 and b"downloading" not in r.stderr


def test_interrupted_download_resumes(hub, tmp_path):
    env = env_for(tmp_path, hub)
    data = GGUF.read_bytes()
    cut = 200_000
    hub.drops["stories260K.gguf"] = [cut, 3]  # every try of the first run drops after 200 kB
    try:
        r = pagoda("tokenize", "-m", "tester/resume", env=env, stdin=b"hi")
    finally:
        left = hub.drops.pop("stories260K.gguf")
    assert left[1] == 0
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "\nerror: " in err  # the error line, after the progress lines
    assert "interrupted" in err and "run the command again to resume" in err
    blobs = repo_dir(tmp_path, "tester/resume") / "blobs"
    part = blobs / (hashlib.sha256(data).hexdigest() + ".incomplete")
    assert part.stat().st_size == 3 * cut  # each try resumed where the last stopped
    assert part.read_bytes() == data[:3 * cut]
    n_before = len(hub.requests("/cdn/"))
    r = pagoda("tokenize", "-m", "tester/resume", env=env, stdin=b"hi")
    assert r.returncode == 0, r.stderr.decode()
    assert b"resuming tester/resume/stories260K.gguf" in r.stderr
    cdn = hub.requests("/cdn/")[n_before:]
    assert len(cdn) == 1 and cdn[0][2].get("Range") == "bytes=%d-" % (3 * cut)
    assert not part.exists()
    blob = blobs / hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    ref = pagoda("tokenize", "-m", str(GGUF), env=env, stdin=b"hi")
    assert r.stdout == ref.stdout


def test_token_sent_and_auth_errors(hub, tmp_path):
    r = tokenize("tester/private", env_for(tmp_path, hub))
    err = r.stderr.decode()
    assert r.returncode == 1 and err.startswith("error: ") and "401" in err and "set HF_TOKEN" in err
    r = tokenize("tester/private", env_for(tmp_path, hub, HF_TOKEN="wrong"))
    assert r.returncode == 1 and b"HF_TOKEN was rejected" in r.stderr
    n = len(hub.requests())
    r = tokenize("tester/private", env_for(tmp_path, hub, HF_TOKEN=TOKEN))
    assert r.returncode == 0, r.stderr.decode()
    sent = hub.requests()[n:]
    api = [q for q in sent if "/api/models/tester/private/" in q[1]]
    res = [q for q in sent if "/resolve/" in q[1]]
    cdn = [q for q in sent if "/cdn/" in q[1]]
    assert api and res and cdn
    for q in api + res:
        assert q[2].get("Authorization") == "Bearer " + TOKEN
    for q in cdn:  # the redirect to another host does not carry the token
        assert "Authorization" not in q[2]
    # the token file huggingface_hub's login writes ($HF_HOME/token) is read too
    tmp2 = tmp_path / "second"
    (tmp2 / "hf").mkdir(parents=True)
    (tmp2 / "hf" / "token").write_text(TOKEN + "\n")
    r = tokenize("tester/private", env_for(tmp2, hub))
    assert r.returncode == 0, r.stderr.decode()


def test_not_found_messages(hub, tmp_path):
    env = env_for(tmp_path, hub)
    r = tokenize("tester/missing", env)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.startswith("error: ")
    assert "repository tester/missing not found" in err and "HF_TOKEN" in err
    r = pagoda("run", "-m", "no/such/path.gguf", "-p", "x", env=env)
    assert r.returncode == 1 and b"no such file or directory" in r.stderr
    assert not repo_dir(tmp_path, "tester/missing").exists() or not any(
        (repo_dir(tmp_path, "tester/missing") / "snapshots").glob("*"))


def test_offline_and_network_down(hub, tmp_path):
    off = env_for(tmp_path, hub, HF_HUB_OFFLINE=1)
    n = len(hub.requests())
    r = tokenize("tester/llama", off)
    assert r.returncode == 1 and b"HF_HUB_OFFLINE" in r.stderr and b"not in the Hugging Face cache" in r.stderr
    assert len(hub.requests()) == n
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    down = env_for(tmp_path, HF_ENDPOINT=dead)
    r = tokenize("tester/llama", down)
    assert r.returncode == 1 and b"cannot reach" in r.stderr and b"HF_HUB_OFFLINE" in r.stderr
    assert tokenize("tester/llama", env_for(tmp_path, hub)).returncode == 0
    r = tokenize("tester/llama", off)
    assert r.returncode == 0 and r.stdout == tokenize(PHI2 / "tokenizer.json", off).stdout
    r = tokenize("tester/llama", down)
    assert r.returncode == 0, r.stderr.decode()
    assert b"using the cached snapshot" in r.stderr


def test_local_path_wins(hub, tmp_path):
    local = tmp_path / "work" / "tester" / "stories-one"
    local.parent.mkdir(parents=True)
    shutil.copy(GGUF, local)
    n = len(hub.requests())
    r = pagoda("tokenize", "-m", "tester/stories-one", env=env_for(tmp_path, hub), cwd=tmp_path / "work",
               stdin=b"hello")
    assert r.returncode == 0, r.stderr.decode()
    assert len(hub.requests()) == n


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors"])
def test_corrupt_download_is_refused(hub, tmp_path, name):
    """A plain file is checked against its git blob id, an LFS file against its sha256."""
    hub.corrupt.add(name)
    try:
        r = tokenize("tester/llama", env_for(tmp_path, hub))
    finally:
        hub.corrupt.discard(name)
    err = r.stderr.decode()
    assert r.returncode == 1 and "does not match the hub's" in err
    assert ("sha256" if name.endswith(".safetensors") else "git blob id") in err
    blobs = repo_dir(tmp_path, "tester/llama") / "blobs"
    data = hub.repos["tester/llama"].commits[hub.llama_main][name]
    etag = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_id(data)
    assert not (blobs / etag).exists() and not (blobs / (etag + ".incomplete")).exists()
    assert not (repo_dir(tmp_path, "tester/llama") / "snapshots" / hub.llama_main / name).exists()
    r = tokenize("tester/llama", env_for(tmp_path, hub))
    assert r.returncode == 0 and (blobs / etag).read_bytes() == data


def test_concurrent_downloads_share_one_blob(hub, tmp_path):
    """Two processes fetching the same file: the .locks/ flock lets one download it, the other
    waits and links the finished blob."""
    env = env_for(tmp_path, hub)
    n = len(hub.requests("/cdn/"))
    procs = [subprocess.Popen([BIN, "tokenize", "-m", "tester/stories-one"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(3)]
    outs = [p.communicate(b"hi", timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len({o[0] for o in outs}) == 1
    assert len(hub.requests("/cdn/")) - n == 1
    rd = repo_dir(tmp_path, "tester/stories-one")
    data = GGUF.read_bytes()
    assert (rd / "blobs" / hashlib.sha256(data).hexdigest()).read_bytes() == data
    assert (tmp_path / "cache" / ".locks" / "models--tester--stories-one").is_dir()


def test_gated_repo_403(hub, tmp_path):
    r = tokenize("tester/gated", env_for(tmp_path, hub))
    err = r.stderr.decode()
    assert r.returncode == 1 and "tester/gated is gated (HTTP 403" in err and "set HF_TOKEN" in err
    assert "accept its conditions" in err and hub.url + "/tester/gated" in err


@pytest.mark.parametrize("body", [b"<html>captive portal</html>", b'{"sha": "main", "siblings": []}',
                                  b'{"sha": "' + b"a" * 40 + b'"}'])
def test_malformed_api_answer(hub, tmp_path, body):
    hub.api_body = body
    try:
        r = tokenize("tester/llama", env_for(tmp_path, hub))
    finally:
        hub.api_body = None
    assert r.returncode == 1
    assert b"the answer is not a model description with a commit sha and siblings" in r.stderr
    assert not any((tmp_path / "cache").rglob("snapshots/*/*"))
