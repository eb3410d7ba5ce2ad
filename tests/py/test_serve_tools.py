"""test_serve_tools.py - a tool call end to end through the `openai` client: a tiny fixture
model (tests/py/tool_model.py: a bigram chain whose greedy answer is one Hermes tool call)
served with Qwen2.5's chat template; the call comes back parsed in `message.tool_calls`
(non-streaming) and as `delta.tool_calls` (streaming), finish_reason "tool_calls"; with
tool_choice "none" or no tools, the same text stays content."""
import json

import pytest

from serve_util import QWEN_TEMPLATE, Server
from tool_model import CALL_JSON, write

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.skipif(not QWEN_TEMPLATE.exists(), reason="shared test data absent")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("toolmodel")
    model = write(str(d / "model"))
    s = Server(log_path=d / "server.log", model=model)
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=60)
    assert s.stop() == 0
    assert "tool-call format hermes" in s.stderr()


def test_tool_call_non_streaming(client):
    r = client.chat.completions.create(model="stories", messages=MSGS, tools=TOOLS, max_tokens=16, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    calls = ch.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert r.usage.completion_tokens == 4  # <tool_call>, the call, </tool_call>, <|im_end|>


def test_tool_call_streaming(client):
    stream = client.chat.completions.create(model="stories", messages=MSGS, tools=TOOLS, max_tokens=16,
                                            temperature=0, stream=True)
    content, calls, finish, order = "", [], [], []
    for c in stream:
        d = c.choices[0].delta
        content += d.content or ""
        calls += d.tool_calls or []
        if d.tool_calls:
            order.append("call")
        if c.choices[0].finish_reason:
            finish.append(c.choices[0].finish_reason)
            order.append("finish")
    assert content == "" and finish == ["tool_calls"]
    # The call is sent when its </tool_call> closes, before the EOS step that ends the output.
    assert order == ["call", "finish"]
    assert calls[0].id.startswith("call_chatcmpl-")
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "unit": "celsius"}


def test_without_tools_the_text_is_content(client):
    r = client.chat.completions.create(model="stories", messages=MSGS, max_tokens=16, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "<tool_call>" + CALL_JSON + "</tool_call>"
    r = client.chat.completions.create(model="stories", messages=MSGS, tools=TOOLS, tool_choice="none",
                                       max_tokens=16, temperature=0)
    assert r.choices[0].message.tool_calls is None


def test_n2_choices_have_their_own_call_ids(client):
    r = client.chat.completions.create(model="stories", messages=MSGS, tools=TOOLS, max_tokens=16, temperature=0,
                                       n=2)
    ids = [ch.message.tool_calls[0].id for ch in r.choices]
    assert len(ids) == 2 and ids[0] != ids[1], ids
    assert all(ch.finish_reason == "tool_calls" for ch in r.choices)


def test_call_cut_off_by_max_tokens_is_content(client):
    # Two tokens: <tool_call> and the call's JSON, but no </tool_call>: not a complete call.
    r = client.chat.completions.create(model="stories", messages=MSGS, tools=TOOLS, max_tokens=2, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "length" and ch.message.tool_calls is None
    assert ch.message.content == "<tool_call>" + CALL_JSON
    stream = client.chat.completions.create(model="stories", messages=MSGS, tools=TOOLS, max_tokens=2,
                                            temperature=0, stream=True)
    content, calls, finish = "", [], []
    for c in stream:
        content += c.choices[0].delta.content or ""
        calls += c.choices[0].delta.tool_calls or []
        if c.choices[0].finish_reason:
            finish.append(c.choices[0].finish_reason)
    assert content == "<tool_call>" + CALL_JSON and calls == [] and finish == ["length"]


def test_last_stream_chunk_has_no_empty_content(client):
    for tools in (TOOLS, None):
        kw = {"tools": tools} if tools else {}
        chunks = list(client.chat.completions.create(model="stories", messages=MSGS, max_tokens=16, temperature=0,
                                                     stream=True, **kw))
        last = chunks[-1].choices[0]
        assert last.finish_reason and last.delta.content is None, last


def test_broken_model_template_is_a_server_error(tmp_path):
    # The model's own template fails to render (a runtime error, not the request's): chats get 500
    # and the start-up log says why; completions still work.
    import os
    import re
    import signal
    import subprocess
    import time

    from serve_util import BIN, http
    model = write(str(tmp_path / "model"))
    cfg_path = os.path.join(model, "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    cfg["chat_template"] = "{% for m in messages %}{{ m.content.no_such_method() }}{% endfor %}"
    json.dump(cfg, open(cfg_path, "w"))
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        p = subprocess.Popen([BIN, "serve", "-m", model, "--device", "cpu", "--threads", "1", "--pa-memory-mb", "16",
                              "--port", "0"], stdout=subprocess.DEVNULL, stderr=f)
    try:
        url = None
        deadline = time.time() + 60
        while url is None and time.time() < deadline and p.poll() is None:
            m = re.search(r"listening on (http://[\d.]+:\d+)", log.read_text(errors="replace"))
            url = m.group(1) if m else time.sleep(0.05)
        assert url, log.read_text(errors="replace")
        assert "warning: the server's chat template is broken" in log.read_text(errors="replace")
        s, r = http(url + "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
        assert s == 500 and "chat template is broken" in r["error"]["message"], r
        s, r = http(url + "/v1/completions", {"prompt": "a", "max_tokens": 1})
        assert s == 200, r
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0


def test_named_tool_choice_offers_that_tool_alone(client):
    other = {"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
                                              "parameters": {"type": "object", "properties": {}}}}
    both = client.chat.completions.create(model="stories", messages=MSGS, tools=[other] + TOOLS, max_tokens=16,
                                          temperature=0)
    named = client.chat.completions.create(model="stories", messages=MSGS, tools=[other] + TOOLS, max_tokens=16,
                                           temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    alone = client.chat.completions.create(model="stories", messages=MSGS, tools=TOOLS, max_tokens=16, temperature=0)
    # the prompt holds only the named tool: the same prompt as with that tool alone
    assert named.usage.prompt_tokens == alone.usage.prompt_tokens < both.usage.prompt_tokens
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
