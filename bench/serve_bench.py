#!/usr/bin/env python3
"""serve_bench.py - online serving benchmark against `pagoda serve` (or any OpenAI-compatible
server), in the manner of `vllm bench serve`: random or shared-prefix prompts of token ids,
a request rate (Poisson arrivals) or a fixed concurrency, streaming completions with EOS ignored;
reports TTFT, TPOT, ITL and end-to-end latency percentiles and throughput. Standard library only.

  bench/serve_bench.py --base-url http://127.0.0.1:8080 --num-prompts 256 --input-len 256 \\
      --output-len 128 --max-concurrency 64 [--request-rate 20] [--dataset shared-prefix]
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def make_prompts(args, vocab):
    rnd = random.Random(args.seed)
    lo_id, hi_id = min(10, vocab - 1), vocab - 1
    prefix = [rnd.randint(lo_id, hi_id) for _ in range(args.shared_prefix_len)] if args.dataset == "shared-prefix" else []
    out = []
    for _ in range(args.num_prompts):
        r = args.random_range_ratio
        n_in = max(1, int(args.input_len * rnd.uniform(1 - r, 1 + r)))
        n_out = max(1, int(args.output_len * rnd.uniform(1 - r, 1 + r)))
        ids = prefix + [rnd.randint(lo_id, hi_id) for _ in range(max(1, n_in - len(prefix)))]
        out.append((ids, n_out))
    return out


def one_request(host, port, headers, model, ids, n_out, temperature):
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": n_out, "temperature": temperature,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    res = {"ok": False, "ttft": None, "itl": [], "e2e": None, "out": 0, "in": len(ids), "error": ""}
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=600)
    try:
        c.request("POST", "/v1/completions", body, headers)
        r = c.getresponse()
        if r.status != 200:
            res["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return res
        last = None
        pending = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            pending += chunk
            while b"\n\n" in pending:
                ev, pending = pending.split(b"\n\n", 1)
                if not ev.startswith(b"data: "):
                    continue
                data = ev[6:]
                if data == b"[DONE]":
                    res["ok"] = True
                    continue
                # Only the usage chunk is parsed: the client must keep up with thousands of
                # chunks per second, so a text chunk is recognised by its non-empty "text".
                if b'"usage":{' in data:
                    j = json.loads(data)
                    res["out"] = j["usage"]["completion_tokens"]
                    if not j.get("choices"):
                        continue
                if b'"text":"' in data and b'"text":""' not in data:
                    now = time.perf_counter()
                    if last is None:
                        res["ttft"] = now - t0
                    else:
                        res["itl"].append(now - last)
                    last = now
        res["e2e"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported as a failed request
        res["error"] = repr(e)
    finally:
        c.close()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default=None, help="model id (default: the server's first)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--dataset", choices=["random", "shared-prefix"], default="random")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--shared-prefix-len", type=int, default=128)
    ap.add_argument("--random-range-ratio", type=float, default=0.0)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf: all at once")
    ap.add_argument("--max-concurrency", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    u = urllib.parse.urlparse(args.base_url)
    host, port = u.hostname, u.port or 80
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    req = urllib.request.Request(args.base_url + "/v1/models", headers=headers)
    models = json.load(urllib.request.urlopen(req, timeout=60))["data"]
    model = args.model or models[0]["id"]
    vocab = models[0].get("vocab_size", 32000)
    prompts = make_prompts(args, vocab)

    results = [None] * len(prompts)
    sem = threading.Semaphore(args.max_concurrency)
    rnd = random.Random(args.seed + 1)
    threads = []

    def run(i, ids, n_out):
        try:
            results[i] = one_request(host, port, headers, model, ids, n_out, args.temperature)
        finally:
            sem.release()

    t0 = time.perf_counter()
    for i, (ids, n_out) in enumerate(prompts):
        sem.acquire()
        t = threading.Thread(target=run, args=(i, ids, n_out))
        t.start()
        threads.append(t)
        if args.request_rate != float("inf"):
            time.sleep(rnd.expovariate(args.request_rate))
    for t in threads:
        t.join()
    dur = time.perf_counter() - t0

    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    tpot = [(r["e2e"] - r["ttft"]) / (r["out"] - 1) for r in ok if r["out"] > 1 and r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    e2e = [r["e2e"] for r in ok]
    out_tok = sum(r["out"] for r in ok)
    in_tok = sum(r["in"] for r in ok)
    summary = {
        "model": model, "dataset": args.dataset, "num_prompts": len(prompts), "completed": len(ok),
        "failed": len(prompts) - len(ok), "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
        "input_len": args.input_len, "output_len": args.output_len, "duration_s": dur,
        "request_throughput": len(ok) / dur, "output_throughput": out_tok / dur,
        "total_token_throughput": (in_tok + out_tok) / dur, "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
    }
    for name, xs in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2el_ms", e2e)):
        summary[f"mean_{name}"] = statistics.fmean(xs) * 1000 if xs else float("nan")
        for p in (50, 90, 99):
            summary[f"p{p}_{name}"] = percentile(xs, p) * 1000
    errors = [r["error"] for r in results if not r["ok"]][:5]
    if args.json:
        print(json.dumps({**summary, "errors": errors}))
    else:
        print("============ Serving Benchmark Result ============")
        for k, v in summary.items():
            print(f"{k:<28} {v:.2f}" if isinstance(v, float) else f"{k:<28} {v}")
        for e in errors:
            print("error:", e)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
