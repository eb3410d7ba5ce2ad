"""test_serve.py - `pagoda serve` through the real `openai` client and raw HTTP on stories260K
(CPU): completions equal llama.cpp's greedy continuation, streaming equals non-streaming, n=2,
stop strings, raw logprobs, reproducible seeds, beam search, cached_tokens, tools reaching the
template, a table of bad requests (status + message), auth, /tokenize, /detokenize, /metrics,
disconnect mid-stream -> blocks back, a full waiting queue -> 429, SIGTERM with a request running
-> it finishes, exit 0."""
import json
import math
import socket
import subprocess
import time
import urllib.request

import pytest

from serve_util import BIN, GREEDY, MODEL, QWEN_TEMPLATE, Server, http, metrics

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.skipif(not MODEL.exists() or not QWEN_TEMPLATE.exists(),
                                reason="shared test data absent")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(log_path=tmp_path_factory.mktemp("serve") / "server.log")
    yield s
    assert s.stop() == 0, s.stderr()
    assert "stopped" in s.stderr()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy_case():
    return json.loads(GREEDY.read_text().splitlines()[0])


def test_startup_log_names_prefix_cache(server):
    assert "prefix cache: block-level (PagedAttention)" in server.stderr()


def test_completion_matches_llama_cpp(client):
    case = greedy_case()
    r = client.completions.create(model="stories", prompt=case["prompt"], max_tokens=case["max_tokens"],
                                  temperature=0)
    assert r.choices[0].text == case["continuation"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 64


def test_completion_stream_equals_non_stream(client):
    case = greedy_case()
    chunks = list(client.completions.create(model="stories", prompt=case["prompt"], max_tokens=40,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == case["continuation"][:len(text)] and len(text) > 100
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]


def test_chat_stream_equals_non_stream(client):
    msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A story about a cat"}]
    full = client.chat.completions.create(model="stories", messages=msgs, max_tokens=30, temperature=0)
    assert full.choices[0].message.role == "assistant"
    content = full.choices[0].message.content
    assert len(content) > 10 and full.usage.completion_tokens == 30
    stream = client.chat.completions.create(model="stories", messages=msgs, max_tokens=30, temperature=0,
                                            stream=True)
    parts, roles = [], []
    for c in stream:
        d = c.choices[0].delta
        if d.role:
            roles.append(d.role)
        parts.append(d.content or "")
    assert "".join(parts) == content and roles == ["assistant"]


def test_n2_and_seeds(client):
    kw = dict(model="stories", prompt="Once upon a time", max_tokens=24, temperature=1.0, n=2, seed=1234)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices], "same seed, same samples"
    assert a.choices[0].text != a.choices[1].text, "two samples differ"
    c = client.completions.create(**{**kw, "seed": 99})
    assert [x.text for x in c.choices] != [x.text for x in a.choices]
    assert a.usage.completion_tokens == 48


def test_stop_string(client):
    r = client.completions.create(model="stories", prompt="Once upon a time", max_tokens=40, temperature=0,
                                  stop=[" named"])
    assert r.choices[0].text == ", there was a little girl"
    assert r.choices[0].finish_reason == "stop"


def test_chat_logprobs_raw(client):
    r = client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 8
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6
        assert t.logprob <= 0 and sum(math.exp(x.logprob) for x in t.top_logprobs) <= 1 + 1e-5
        assert [x.logprob for x in t.top_logprobs] == sorted([x.logprob for x in t.top_logprobs], reverse=True)
    # Raw logprobs: temperature does not change the logprob reported for the same token.
    r2 = client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=1, temperature=0.3, seed=5, logprobs=True, top_logprobs=3)
    t2 = r2.choices[0].logprobs.content[0]
    first = {x.token: x.logprob for x in content[0].top_logprobs}
    if t2.token in first:
        assert abs(first[t2.token] - t2.logprob) < 1e-5


def test_completion_logprobs_format(client):
    r = client.completions.create(model="stories", prompt="Once upon a time", max_tokens=5, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == 5 and len(lp.top_logprobs) == 5 and lp.text_offset[0] == 0
    assert all(len(t) == 2 for t in lp.top_logprobs)


def test_beam_search(client):
    kw = dict(model="stories", prompt="Once upon a time", max_tokens=12, n=2,
              extra_body={"use_beam_search": True, "best_of": 3})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert len(a.choices) == 2 and [c.text for c in a.choices] == [c.text for c in b.choices]


def test_cached_tokens(client):
    prompt = "Once upon a time, there was a little girl named Lily. " * 8
    client.completions.create(model="stories", prompt=prompt, max_tokens=2, temperature=0)
    r = client.completions.create(model="stories", prompt=prompt, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= 32
    assert r.usage.prompt_tokens_details.cached_tokens % 32 == 0


def test_tools_reach_the_template(server, client):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    s0, plain = http(server.url + "/tokenize", {"messages": msgs})
    s1, with_tools = http(server.url + "/tokenize", {"messages": msgs, "tools": tools})
    assert s0 == 200 and s1 == 200 and with_tools["count"] > plain["count"] + 20
    # stories260K writes no tool call: the answer is plain content, finish_reason unchanged.
    r = client.chat.completions.create(model="stories", messages=msgs, tools=tools, max_tokens=8, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == with_tools["count"]


def test_models_tokenize_detokenize_health(server, client):
    assert [m.id for m in client.models.list().data] == ["stories"]
    s, t = http(server.url + "/tokenize", {"prompt": "Once upon a time"})
    assert s == 200 and t["count"] == 5 and t["tokens"][0] == 1
    s, d = http(server.url + "/detokenize", {"tokens": t["tokens"]})
    assert s == 200 and d["prompt"] == "Once upon a time"
    assert http(server.url + "/health") == (200, {"status": "ok"})


def test_chat_page_served(server):
    s, page = http(server.url + "/")
    assert s == 200 and "/v1/chat/completions" in page and "<script>" in page and "http" not in page.split(
        "<script>")[0].replace("http-equiv", "")


PM = "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids"
BAD = [
    # (path, body, status, message substring)
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1,2]", 400, "must be a JSON object"),
    ("/v1/completions", {"max_tokens": 4}, 400, "'prompt' must be"),
    ("/v1/completions", {"prompt": [[[1]]]}, 400, PM),
    ("/v1/completions", {"prompt": [1, [2]]}, 400, PM),
    ("/v1/completions", {"prompt": [{"a": 1}]}, 400, PM),
    ("/v1/completions", {"prompt": "a", "stop": ""}, 400, "'stop' must be a string or an array of non-empty strings"),
    ("/v1/completions", {"prompt": "a", "stop": [""]}, 400, "'stop' must be a string or an array of non-empty strings"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0].content is missing"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": None}]},
     400, "messages[1].content is missing"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "tool_choice \"required\" is not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes",
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "'tool_choice' must be \"auto\", \"none\", \"required\" or"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function",
                              "function": {"name": "g"}}, "tools": [{"type": "function", "function": {"name": "f"}}]},
     400, "tool_choice names function 'g', which is not in 'tools'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function",
                              "function": {"name": "g"}}}, 400, "tool_choice names function 'g' but the request has no"),
    ("/v1/completions", {"prompt": "a", "max_tokens": "x"}, 400, "'max_tokens' must be an integer"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "'max_tokens' must be in"),
    ("/v1/completions", {"prompt": "a", "temperature": 5}, 400, "'temperature' must be in"),
    ("/v1/completions", {"prompt": "a", "n": 0}, 400, "'n' must be in"),
    ("/v1/completions", {"prompt": "a", "top_p": 0}, 400, "'top_p' must be in"),
    ("/v1/completions", {"prompt": "a", "logprobs": 9}, 400, "'logprobs' must be in"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {"x": 1}}, 400, "'logit_bias' key 'x'"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {"1": 500}}, 400, "[-100, 100]"),
    ("/v1/completions", {"prompt": "a", "stop": 3}, 400, "'stop' must be"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "token ids must be integers in [0, 512)"),
    ("/v1/completions", {"prompt": [346.9]}, 400, "token ids must be integers in [0, 512)"),
    ("/v1/completions", {"prompt": [[1, 2.5]]}, 400, "token ids must be integers in [0, 512)"),
    ("/v1/completions", {"prompt": "a", "stop_token_ids": [2.5]}, 400, "'stop_token_ids' entries must be integer"),
    ("/v1/completions", b'{"prompt": "\\u0000a"}', 400, "NUL character (\\u0000 at byte 12)"),
    ("/v1/completions", b'{"prompt": "a"}\x00{"garbage', 400, "not valid JSON (at byte 15)"),
    ("/v1/completions", {"prompt": [1] * 3000, "max_tokens": 4}, 400, "2048"),
    ("/v1/completions", {"prompt": [1] + [300] * 1999, "max_tokens": 100}, 400,
     "the prompt (2000 tokens) plus max_tokens (100) exceeds the maximum sequence length of 2048"),
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "only allowed with"),
    ("/v1/completions", {"prompt": "a", "model": "gpt-4"}, 404, "The model `gpt-4` does not exist"),
    ("/v1/completions", {"prompt": "a", "best_of": 1, "n": 2}, 400, "'best_of' (1) must be >= n"),
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty array"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "'role' must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "'content' must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400,
     "needs \"logprobs\": true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": 3}, 400, "'tools' must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "use_beam_search": True}, 400,
     "/v1/completions only"),
    ("/v1/nothing", {}, 404, "no such endpoint"),
    ("/detokenize", {"tokens": [1, 100000]}, 400, "integer token ids in [0, 512)"),
    ("/detokenize", {"tokens": [4294967642]}, 400, "integer token ids in [0, 512)"),
    ("/detokenize", {"tokens": [-1]}, 400, "integer token ids in [0, 512)"),
    ("/tokenize", {"text": "a"}, 400, "/tokenize takes"),
]


@pytest.mark.parametrize("path,body,status,msg", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_requests(server, path, body, status, msg):
    s, r = http(server.url + path, body)
    assert s == status, r
    assert r["error"]["code"] == status and msg in r["error"]["message"], r
    assert r["error"]["type"] and "param" in r["error"]


def test_escaped_backslash_is_not_a_nul(server):
    # "\\u0000" in JSON is a backslash then "u0000": a plain prompt, not a NUL.
    s, r = http(server.url + "/tokenize", b'{"prompt": "a\\\\u0000"}')
    assert s == 200 and r["count"] > 1, r


def test_detokenize_keeps_nul_bytes(server):
    raw = urllib.request.urlopen(urllib.request.Request(server.url + "/detokenize", data=b'{"tokens":[3,4,5]}',
                                                         headers={"Content-Type": "application/json"})).read()
    assert b"\\u0000" in raw, raw
    assert json.loads(raw)["prompt"] == "\x00\x01\x02"


def test_oversized_content_length_is_413_before_the_body(server):
    host, port = server.url[len("http://"):].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 99999999999\r\n\r\n")  # no body follows: the answer must not wait for it
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    sock.close()
    assert got.startswith(b"HTTP/1.1 413"), got


def test_broken_chat_template_refused_at_start(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}\n{% if %}{% endfor %}")
    p = subprocess.run([BIN, "serve", "-m", str(MODEL), "--device", "cpu", "--port", "0",
                        "--chat-template", str(bad)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"error: --chat-template {bad}: line 2 column "), p.stderr


def test_wrong_method_and_still_serving(server, client):
    s, r = http(server.url + "/v1/completions")
    assert s == 405 and "use POST" in r["error"]["message"]
    assert client.completions.create(model="stories", prompt="Once", max_tokens=2).usage.completion_tokens == 2


def test_disconnect_returns_blocks(server):
    host, port = server.url[len("http://"):].split(":")
    before = metrics(server.url).get('pagoda:request_success_total{finished_reason="abort"}', 0)
    body = json.dumps({"model": "stories", "prompt": "Once upon a time", "max_tokens": 1500,
                       "ignore_eos": True, "stream": True}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 5:
        got += sock.recv(4096)
    assert metrics(server.url)["pagoda:kv_blocks_used"] > 0
    sock.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = metrics(server.url)
        if m["pagoda:kv_blocks_used"] == 0 and m['pagoda:request_success_total{finished_reason="abort"}'] > before:
            break
        time.sleep(0.05)
    assert m["pagoda:kv_blocks_used"] == 0 and m["pagoda:num_requests_running"] == 0
    assert m['pagoda:request_success_total{finished_reason="abort"}'] == before + 1


def test_disconnect_non_streaming_aborts(server):
    host, port = server.url[len("http://"):].split(":")
    before = metrics(server.url).get('pagoda:request_success_total{finished_reason="abort"}', 0)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.time() + 10
    while metrics(server.url)["pagoda:kv_blocks_used"] == 0 and time.time() < deadline:
        time.sleep(0.01)
    sock.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = metrics(server.url)
        if m["pagoda:kv_blocks_used"] == 0 and m['pagoda:request_success_total{finished_reason="abort"}'] > before:
            break
        time.sleep(0.05)
    assert m['pagoda:request_success_total{finished_reason="abort"}'] == before + 1
    assert m["pagoda:kv_blocks_used"] == 0


def test_metrics_histograms(server, client):
    client.completions.create(model="stories", prompt="Once", max_tokens=4)
    m = metrics(server.url)
    assert m["pagoda:kv_blocks_total"] == 818
    assert m["pagoda:time_to_first_token_seconds_count"] >= 1
    assert m['pagoda:time_to_first_token_seconds_bucket{le="+Inf"}'] == m["pagoda:time_to_first_token_seconds_count"]
    assert m["pagoda:e2e_request_latency_seconds_count"] >= m["pagoda:time_per_output_token_seconds_count"] >= 1
    assert m["pagoda:inter_token_latency_seconds_count"] >= 3 * m["pagoda:time_per_output_token_seconds_count"]
    assert m["pagoda:prefix_cache_queries_total"] >= m["pagoda:prefix_cache_hits_total"] > 0
    assert m["pagoda:generation_tokens_total"] > 0


def test_auth(tmp_path):
    s = Server("--api-key", "sekret", log_path=tmp_path / "auth.log")
    try:
        st, r = http(s.url + "/v1/models")
        assert st == 401 and "API key" in r["error"]["message"]
        st, r = http(s.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert st == 401
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="stories", prompt="a", max_tokens=1)
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model="stories", prompt="a", max_tokens=1).usage.completion_tokens == 1
        assert http(s.url + "/health")[0] == 200
        for scheme in ("bearer", "BEARER"):  # the scheme is case-insensitive
            assert http(s.url + "/v1/models", headers={"Authorization": scheme + " sekret"})[0] == 200
    finally:
        assert s.stop() == 0


def test_empty_api_key_refused_at_start():
    p = subprocess.run([BIN, "serve", "-m", str(MODEL), "--device", "cpu", "--port", "0", "--api-key", ""],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: --api-key is empty"), p.stderr


def test_sigterm_lets_running_request_finish(tmp_path):
    s = Server("--shutdown-grace", "30", log_path=tmp_path / "term.log")
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=60)
    stream = c.completions.create(model="stories", prompt="Once upon a time", max_tokens=300, temperature=0,
                                  stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    first = next(it)
    s.proc.send_signal(15)
    rest = list(it)
    assert [x.choices[0].finish_reason for x in rest if x.choices and x.choices[0].finish_reason] == ["length"]
    assert len(rest) + 1 >= 250  # about one chunk per token, all of them delivered
    assert first.choices[0].text
    assert s.stop() == 0
    assert "SIGTERM received" in s.stderr()


def test_queue_full_is_429(tmp_path):
    import threading
    s = Server("--max-waiting", "1", "--max-num-seqs", "1", log_path=tmp_path / "q.log")
    try:
        host, port = s.url[len("http://"):].split(":")
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
                           "stream": True}).encode()
        a = socket.create_connection((host, int(port)))  # A runs: the only sequence slot
        a.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:
            got += a.recv(4096)
        b_result = {}
        tb = threading.Thread(target=lambda: b_result.update(r=http(s.url + "/v1/completions",
                                                                     {"prompt": "The dog", "max_tokens": 4})))
        tb.start()  # B waits for the slot: the queue (1) is full
        deadline = time.time() + 10
        while metrics(s.url)["pagoda:num_requests_queued"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        st, r = http(s.url + "/v1/completions", {"prompt": "C", "max_tokens": 4})
        assert st == 429 and "queue is full" in r["error"]["message"] and r["error"]["type"] == "rate_limit_error"
        a.close()  # A aborted: B runs
        tb.join(30)
        assert b_result["r"][0] == 200 and b_result["r"][1]["usage"]["completion_tokens"] == 4
        assert metrics(s.url)["pagoda:requests_rejected_busy_total"] == 1
    finally:
        assert s.stop() == 0


def test_logprobs_with_n2_samples(client):
    r = client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=6, temperature=1.0, seed=3, n=2, logprobs=True, top_logprobs=2)
    assert len(r.choices) == 2
    for ch in r.choices:
        content = ch.logprobs.content
        assert len(content) == 6 and "".join(t.token for t in content) == ch.message.content
        for t in content:  # a sampled token is at most as likely as the best one
            assert t.logprob <= t.top_logprobs[0].logprob + 1e-6


def test_logprobs_of_a_partial_utf8_byte_token(client):
    # stories260K: ids 3..258 are the byte tokens <0x00>..<0xFF>; 229 = 0xE2, the first byte of a
    # three-byte character. Its "token" must stay valid JSON text (U+FFFD) and "bytes" exact.
    r = client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=1, temperature=0, logprobs=True, top_logprobs=1,
                                       logit_bias={"229": 100})
    t = r.choices[0].logprobs.content[0]
    assert t.token == "\ufffd" and t.bytes == [0xE2]


def _mutations(rnd):
    """Hostile bodies: valid requests with fields replaced by random JSON values, truncations,
    byte flips, deep nesting, invalid UTF-8."""
    base = [{"prompt": "Once upon a time", "max_tokens": 3},
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
            {"prompt": [1, 2, 3], "max_tokens": 2, "n": 2, "logprobs": 1}]
    fields = ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed", "stop",
              "logit_bias", "logprobs", "top_logprobs", "stream", "stream_options", "best_of", "use_beam_search",
              "tools", "tool_choice", "stop_token_ids", "min_tokens", "echo", "model", "response_format"]
    values = [None, True, False, 0, -1, 1, 2.5, -1e308, 1e308, 2**63, "", "x", "\u0000", [], [None], {}, {"a": 1},
              [[1, 2], "a"], [{"role": "user"}], {"1": "x"}, "é" * 1000, [1] * 50]
    for _ in range(300):
        b = dict(rnd.choice(base))
        for _ in range(rnd.randint(1, 4)):
            b[rnd.choice(fields)] = rnd.choice(values)
        raw = json.dumps(b).encode()
        k = rnd.random()
        if k < 0.15:
            raw = raw[:rnd.randint(0, len(raw))]
        elif k < 0.3:
            i = rnd.randrange(len(raw))
            raw = raw[:i] + bytes([rnd.randrange(256)]) + raw[i + 1:]
        elif k < 0.35:
            raw = b"[" * 5000 + b"]" * 5000
        elif k < 0.4:
            raw = b'{"prompt": "\xff\xfe\xc3", "max_tokens": 2}'
        yield rnd.choice(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]), raw


def test_hostile_bodies_never_hurt_the_server(server, client):
    import random
    rnd = random.Random(7)
    seen = set()
    for path, raw in _mutations(rnd):
        st, r = http(server.url + path, raw)
        seen.add(st)
        assert st in (200, 400, 404), (path, raw[:200], st, r)
        if st != 200:
            assert isinstance(r, dict) and r["error"]["code"] == st and r["error"]["message"], r
        elif isinstance(r, str):  # a stream that was asked for
            assert r.rstrip().endswith("data: [DONE]"), r[-200:]
    assert {200, 400} <= seen
    m = metrics(server.url)
    assert m["pagoda:kv_blocks_used"] == 0 and m["pagoda:num_requests_running"] == 0
    case = greedy_case()
    r = client.completions.create(model="stories", prompt=case["prompt"], max_tokens=64, temperature=0)
    assert r.choices[0].text == case["continuation"]


def test_generated_nul_bytes_are_kept(server):
    # logit_bias forces token 3 (the byte token <0x00>): the text is one NUL, written as \u0000.
    body = {"prompt": "Once", "max_tokens": 2, "temperature": 0, "logit_bias": {"3": 100}}
    for stream in (False, True):
        raw = urllib.request.urlopen(urllib.request.Request(
            server.url + "/v1/completions", data=json.dumps({**body, "stream": stream}).encode(),
            headers={"Content-Type": "application/json"})).read().decode()
        if stream:
            text = "".join(json.loads(l[6:])["choices"][0]["text"] for l in raw.splitlines()
                           if l.startswith("data: {") and json.loads(l[6:])["choices"])
        else:
            text = json.loads(raw)["choices"][0]["text"]
        assert text == "\x00\x00", raw
    s, r = http(server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
                                                      "temperature": 0, "logit_bias": {"3": 100}})
    assert s == 200 and r["choices"][0]["message"]["content"] == "\x00\x00", r


def test_chunked_body_over_the_limit_is_not_read_on(tmp_path):
    # Without Content-Length the size is known only while reading: past the limit the connection
    # is closed (libmicrohttpd cannot answer mid-upload) instead of reading the rest.
    s = Server("--max-body-mb", "1", log_path=tmp_path / "big.log")
    try:
        host, port = s.url[len("http://"):].split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * (1 << 19)
        closed = False
        try:
            for _ in range(64):  # 32 MiB if it were read on; no last chunk ever follows
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            closed = sock.recv(4096) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        sock.close()
        assert closed
        assert "body grew past --max-body-mb" in s.stderr()
        assert http(s.url + "/health")[0] == 200
    finally:
        assert s.stop() == 0
