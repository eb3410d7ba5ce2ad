"""The Python package (python/pagoda) over libpagoda on the CPU with stories260K: determinism,
offline batches equal single requests, streaming, cancellation, threads, asyncio, errors."""
import asyncio
import ctypes
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
if "PAGODA_LIBRARY" not in os.environ and os.environ.get("PAGODA_BIN"):
    lib = Path(os.environ["PAGODA_BIN"]).parent / "libpagoda.so"
    if lib.is_file():
        os.environ["PAGODA_LIBRARY"] = str(lib)

import pagoda  # noqa: E402

TESTDATA = ROOT.parent / "shared" / "testdata"
MODEL = str(TESTDATA / "models" / "stories260K.gguf")
TEMPLATE = str(TESTDATA / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja")
GREEDY = TESTDATA / "models" / "stories260K.greedy.jsonl"

WORDS = ("Once upon a time", "The little dog", "Lily and Tom", "One day", "The sun was",
         "A big red ball", "Tim had a", "In the park")


@pytest.fixture(scope="module")
def runner():
    r = pagoda.Runner(model=MODEL, device="cpu", threads=2, chat_template=TEMPLATE, pa_memory_mb=64)
    yield r
    r.close()


def greedy(max_tokens=24, **kw):
    return pagoda.SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def test_greedy_matches_reference(runner):
    refs = [json.loads(line) for line in GREEDY.read_text().splitlines() if line.strip()]
    outs = runner.generate([r["prompt"] for r in refs], [greedy(r["max_tokens"]) for r in refs])
    for ref, out in zip(refs, outs):
        assert out.outputs[0].text == ref["continuation"]
        assert out.outputs[0].finish_reason in ("length", "stop")
        assert out.usage.completion_tokens == len(out.outputs[0].token_ids)


def test_same_seed_same_output(runner):
    req = dict(prompt="Once upon a time", max_tokens=40, temperature=1.0, top_p=0.95)
    a = runner.send_completion_request(pagoda.CompletionRequest(seed=1234, **req)).choices[0].text
    b = runner.send_completion_request(pagoda.CompletionRequest(seed=1234, **req)).choices[0].text
    c = runner.send_completion_request(pagoda.CompletionRequest(seed=99, **req)).choices[0].text
    assert a == b
    assert a != c
    # Runner(seed=...) seeds requests that give none: two fresh runners give the same texts.
    texts = []
    for _ in range(2):
        with pagoda.Runner(model=MODEL, device="cpu", threads=2, seed=7, pa_memory_mb=16) as r:
            texts.append([r.send_completion_request(pagoda.CompletionRequest(**req)).choices[0].text
                          for _ in range(2)])
    assert texts[0] == texts[1]
    assert texts[0][0] != texts[0][1]


def test_generate_64_equals_one_at_a_time(runner):
    prompts = [f"{WORDS[i % len(WORDS)]} {'and ' * (i // len(WORDS))}".strip() for i in range(64)]
    sp = greedy(32)
    batch = runner.generate(prompts, sp)
    assert len(batch) == 64
    for p, out in zip(prompts, batch):
        assert out.prompt == p
        one = runner.send_completion_request(pagoda.CompletionRequest(prompt=p, max_tokens=32, temperature=0))
        assert out.outputs[0].text == one.choices[0].text
        assert out.outputs[0].token_ids and len(out.outputs[0].token_ids) == one.usage.completion_tokens


def test_streaming_deltas_join_to_full_text(runner):
    full = runner.send_completion_request(
        pagoda.CompletionRequest(prompt="The little dog", max_tokens=48, temperature=0)).choices[0].text
    chunks = list(runner.send_completion_request(
        pagoda.CompletionRequest(prompt="The little dog", max_tokens=48, temperature=0, stream=True)))
    assert len(chunks) > 10
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 48
    assert chunks[-2].choices[0].finish_reason == "length"

    msgs = [{"role": "user", "content": "Tell me a story"}]
    res = runner.send_chat_completion_request(
        pagoda.ChatCompletionRequest(messages=msgs, max_tokens=40, temperature=0))
    stream = runner.send_chat_completion_request(
        pagoda.ChatCompletionRequest(messages=msgs, max_tokens=40, temperature=0, stream=True))
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == res.choices[0].message.content
    assert res.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == res.usage.prompt_tokens > 10
    assert res.object == "chat.completion" and chunks[0].object == "chat.completion.chunk"


def wait_idle(runner, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        s = runner.stats()
        if s.active == 0 and s.free_blocks == s.num_blocks:
            return s
        time.sleep(0.01)
    return runner.stats()


def test_cancellation_frees_blocks(runner):
    before = wait_idle(runner)
    prompt = "Once upon a time " * 20
    it = runner.send_completion_request(pagoda.CompletionRequest(
        prompt=prompt, max_tokens=1500, ignore_eos=True, temperature=0, stream=True))
    got = 0
    for chunk in it:
        got += 1
        if got == 5:
            s = runner.stats()
            assert s.active == 1 and s.free_blocks < s.num_blocks
            break
    del it, chunk
    gc.collect()
    after = wait_idle(runner)
    assert after.active == 0
    assert after.free_blocks == after.num_blocks
    assert after.aborted == before.aborted + 1
    assert after.generated_tokens < before.generated_tokens + 1500

    # close() from another thread while a blocking (non-streaming) request waits is not needed;
    # a closed stream object keeps raising StopIteration
    it = runner.send_completion_request(pagoda.CompletionRequest(
        prompt=prompt, max_tokens=1500, ignore_eos=True, temperature=0, stream=True))
    next(it)
    it.close()
    assert list(it) == []
    assert wait_idle(runner).free_blocks == before.num_blocks


def test_eight_threads_one_runner(runner):
    prompts = [f"{WORDS[i % len(WORDS)]}" for i in range(8)]
    ref = {p: runner.send_completion_request(
        pagoda.CompletionRequest(prompt=p, max_tokens=24, temperature=0)).choices[0].text for p in prompts}
    errors, results = [], {}

    def work(t):
        try:
            for k in range(4):
                p = prompts[(t + k) % 8]
                if k % 2:
                    text = "".join(c.choices[0].text for c in runner.send_completion_request(
                        pagoda.CompletionRequest(prompt=p, max_tokens=24, temperature=0, stream=True)) if c.choices)
                else:
                    text = runner.generate([p], greedy(24))[0].outputs[0].text
                results[(t, k)] = (p, text)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(results) == 32
    for p, text in results.values():
        assert text == ref[p]


def test_asyncio(runner):
    prompts = ["Once upon a time", "The little dog", "One day", "In the park"]
    ref = [runner.send_completion_request(pagoda.CompletionRequest(prompt=p, max_tokens=20, temperature=0))
           .choices[0].text for p in prompts]

    async def main():
        rs = await asyncio.gather(*[runner.send_completion_request_async(
            pagoda.CompletionRequest(prompt=p, max_tokens=20, temperature=0)) for p in prompts])
        it = await runner.send_completion_request_async(
            pagoda.CompletionRequest(prompt=prompts[0], max_tokens=20, temperature=0, stream=True))
        parts = [c.choices[0].text async for c in it if c.choices]
        gen = await runner.generate_async(prompts, greedy(20))
        return [r.choices[0].text for r in rs], "".join(parts), [g.outputs[0].text for g in gen]

    texts, streamed, gen = asyncio.run(main())
    assert texts == ref and gen == ref
    assert streamed == ref[0]

    async def cancel():
        it = await runner.send_completion_request_async(pagoda.CompletionRequest(
            prompt="Once upon a time", max_tokens=1500, ignore_eos=True, stream=True))
        async for _ in it:
            break
        assert runner.stats().active == 1
        await it.aclose()

    before = wait_idle(runner)
    asyncio.run(cancel())
    after = wait_idle(runner)
    assert after.active == 0 and after.free_blocks == after.num_blocks and after.aborted == before.aborted + 1


def test_n_samples_and_logprobs(runner):
    out = runner.generate("Once upon a time", pagoda.SamplingParams(n=3, seed=5, max_tokens=16, logprobs=2))[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({o.text for o in out.outputs}) > 1
    o = out.outputs[0]
    assert len(o.logprobs) == len(o.token_ids)
    for tid, lp in zip(o.token_ids, o.logprobs):
        assert tid in lp and all(v <= 0 for v in lp.values())
    assert out.usage.completion_tokens == sum(len(x.token_ids) for x in out.outputs)


def test_stats_prefix_hits(runner):
    long_prompt = "Lily and Tom went to the park. " * 12
    s0 = runner.stats()
    for _ in range(2):
        runner.generate(long_prompt, greedy(4))
    s1 = runner.stats()
    assert s1.prefix_hits > s0.prefix_hits
    assert 0 < s1.prefix_hit_rate <= 1
    assert s1.kv_peak_usage > 0 and s1.paged and s1.block_size == 32
    res = runner.send_completion_request(pagoda.CompletionRequest(prompt=long_prompt, max_tokens=4, temperature=0))
    assert res.usage.cached_tokens > 0 and res.usage.prompt_tokens_details.cached_tokens == res.usage.cached_tokens


def test_seed_aliases():
    """The seeds' example (Which.Plain, pa_gpu_mem, pa_blk_size, PagedCacheType, the request)."""
    with pagoda.Runner(which=pagoda.Which.Plain(model_id=MODEL), device="cpu", pa_gpu_mem=8, pa_blk_size=16,
                       pa_cache_type=pagoda.PagedCacheType.Auto, threads=2, chat_template=TEMPLATE) as r:
        res = r.send_chat_completion_request(pagoda.ChatCompletionRequest(
            model="mistral", messages=[{"role": "user", "content": "Tell me a story about the Rust type system."}],
            max_tokens=32, presence_penalty=1.0, top_p=0.1, temperature=0.1))
        assert res.model == "mistral" and res.choices[0].message.role == "assistant"
        assert res.choices[0].message.content and res.choices[0].message.tool_calls is None
        u = res.usage
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens and 0 < u.completion_tokens <= 32
        assert res.choices[0].finish_reason == ("length" if u.completion_tokens == 32 else "stop")
        assert u.tokens_per_second > 0 and u.total_time >= u.time_to_first_token > 0
        s = r.stats()
        assert s.block_size == 16
        assert s.num_blocks * 16 * 5 * 2 * 4 * 8 * 2 <= 8 * 2**20  # f16 K+V, 5 layers, 4 kv heads x 8
        res = r.send_completion_request(pagoda.CompletionRequest(prompt="Once upon a time", max_tokens=8,
                                                                 temperature=0))
        assert res.choices[0].text == ", there was a little girl"


def test_seed_example_f8e4m3():
    """The seeds' example exactly as they write it, PagedCacheType.F8E4M3 included: the FP8 KV
    cache runs (CPU reference kernels) and its pool holds twice the blocks of the f16 cache
    (the auto choice for a GGUF on the CPU) in the same pa_gpu_mem."""
    blocks = {}
    for ct in (pagoda.PagedCacheType.Auto, pagoda.PagedCacheType.F8E4M3):
        with pagoda.Runner(which=pagoda.Which.Plain(model_id=MODEL), device="cpu", pa_gpu_mem=8, pa_blk_size=32,
                           pa_cache_type=ct, threads=2, chat_template=TEMPLATE) as r:
            res = r.send_chat_completion_request(pagoda.ChatCompletionRequest(
                model="default", messages=[{"role": "user", "content": "Tell me a story about the Rust type system."}],
                max_tokens=32, presence_penalty=1.0, top_p=0.1, temperature=0.1))
            assert res.choices[0].message.content and 0 < res.usage.completion_tokens <= 32
            blocks[ct] = r.stats().num_blocks
    # num_blocks leaves out the null block; the pools (with it) are floor(8 MiB / block bytes)
    f8, f16 = blocks[pagoda.PagedCacheType.F8E4M3] + 1, blocks[pagoda.PagedCacheType.Auto] + 1
    assert 2 * f16 <= f8 <= 2 * f16 + 1, blocks


@pytest.mark.parametrize("kw,name", [
    (dict(pa_block_size=7), "pa_block_size"), (dict(paged_attn="maybe"), "paged_attn"),
    (dict(pa_cache_type="int3"), "pa_cache_type"), (dict(pa_memory_mb=8, pa_context_len=64), "pa_context_len"),
    (dict(device="tpu"), "device"), (dict(max_num_seqs=0), "max_num_seqs"), (dict(isq="Q4K"), "isq"),
])
def test_runner_bad_arguments(kw, name):
    with pytest.raises(ValueError, match=name):
        pagoda.Runner(model=MODEL, **kw)


def test_errors(runner, tmp_path):
    with pytest.raises(pagoda.ModelLoadError, match="no_such_model"):
        pagoda.Runner(model=str(tmp_path / "no_such_model.gguf"), device="cpu")
    for kw, name in [(dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
                     (dict(max_tokens=0), "max_tokens"), (dict(stop=[""]), "stop"),
                     (dict(logprobs=99), "logprobs"), (dict(n=0), "n")]:
        with pytest.raises(ValueError, match=name):
            runner.send_completion_request(pagoda.CompletionRequest(prompt="x", **kw))
    with pytest.raises(pagoda.PromptTooLongError) as e:
        runner.send_completion_request(pagoda.CompletionRequest(prompt="Once upon a time " * 600, max_tokens=8))
    assert str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(pagoda.InvalidRequestError):
        runner.send_completion_request(pagoda.CompletionRequest(prompt=[1, 2, 100000], max_tokens=4))
    with pytest.raises(ValueError, match="messages"):
        runner.send_chat_completion_request(pagoda.ChatCompletionRequest(messages=[]))
    with pytest.raises(ValueError, match="tools"):
        runner.send_chat_completion_request(pagoda.ChatCompletionRequest(
            messages=[{"role": "user", "content": "x"}], tools=[{"type": "function"}]))
    # the Runner keeps serving after refusals
    assert wait_idle(runner).active == 0
    assert runner.generate("Once upon a time", greedy(8))[0].outputs[0].text == ", there was a little girl"


def test_chat_without_template_says_so():
    with pagoda.Runner(model=MODEL, device="cpu", threads=2, pa_memory_mb=8) as r:
        with pytest.raises(ValueError, match="no chat template"):
            r.send_chat_completion_request(pagoda.ChatCompletionRequest(
                messages=[{"role": "user", "content": "Hi"}], max_tokens=4))
    with pytest.raises(pagoda.EngineClosedError):
        r.generate("x")


def test_tool_call_parsing():
    content, calls = pagoda.parse_tool_calls(
        "hermes", 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert content == "Sure." and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"} and calls[0].id.startswith("call_")
    content, calls = pagoda.parse_tool_calls(
        "llama3", '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}')
    assert content == "" and [c.function.name for c in calls] == ["a", "b"]
    again = pagoda.parse_tool_calls("llama3", '{"name": "a", "parameters": {"x": 1}}')[1]
    assert len({c.id for c in calls + again}) == 3  # unique across requests
    content, calls = pagoda.parse_tool_calls("mistral", '[TOOL_CALLS][{"name": "f", "arguments": "{}"}]')
    assert calls[0].function.arguments == "{}"
    assert pagoda.parse_tool_calls("hermes", "just text") == ("just text", None)
    assert pagoda.parse_tool_calls("llama3", '{"not": "a call"}') == ('{"not": "a call"}', None)


def test_tools_reach_the_template(runner):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    with_tools = runner.apply_chat_template(msgs, tools)
    assert "get_weather" in with_tools and "<tools>" in with_tools
    assert "get_weather" not in runner.apply_chat_template(msgs)
    res = runner.send_chat_completion_request(pagoda.ChatCompletionRequest(
        messages=msgs, tools=tools, max_tokens=8, temperature=0))
    plain = runner.send_chat_completion_request(pagoda.ChatCompletionRequest(
        messages=msgs, tools=tools, tool_choice="none", max_tokens=8, temperature=0))
    assert res.usage.prompt_tokens > plain.usage.prompt_tokens
    assert plain.usage.prompt_tokens == len(runner.tokenize(runner.apply_chat_template(msgs), False, True))


def test_isq_runner_matches_cli():
    """Runner(isq="8") quantizes as `pagoda run --isq 8` does: the same greedy text."""
    prompt = "Once upon a time"
    r = pagoda.Runner(model=MODEL, device="cpu", isq="8", threads=1, pa_memory_mb=64)
    try:
        res = r.send_completion_request(pagoda.CompletionRequest(prompt=prompt, max_tokens=24, temperature=0))
    finally:
        r.close()
    cli = subprocess.run([os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda")), "run", "-m", MODEL, "--isq", "8", "--raw", "--temperature", "0",
                          "-n", "24", "-p", prompt, "-t", "1"], capture_output=True, check=True)
    assert res.choices[0].text == cli.stdout.decode()


def test_struct_layout_matches_library():
    """Every ctypes mirror has the size the library reports (pagoda_struct_size)."""
    from pagoda import _ffi
    L = _ffi.lib()
    for name, cls in _ffi._MIRRORS.items():
        assert L.pagoda_struct_size(name.encode()) == ctypes.sizeof(cls), name
    assert L.pagoda_struct_size(b"no_such_struct") == 0
