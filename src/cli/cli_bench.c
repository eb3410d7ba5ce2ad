/* cli_bench.c - `pagoda bench`: offline throughput over synthetic prompts (like vllm bench
 * throughput): every request is queued at time 0 and the engine runs until all are done. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/engine_flags.h"
#include "pagoda.h"

/* The bench's own flags, with their defaults (usage prints these). */
struct bench_opts {
  int num_prompts, input_len, output_len, shared, json;
  double ratio, temp;
  long long seed;
};

static void usage(FILE *f, const struct bench_opts *o, const struct pagoda_engine_params *ep) {
  fprintf(f,
          "usage: pagoda bench [-m MODEL] [options]\n\n"
          "Offline throughput: NUM_PROMPTS synthetic prompts of random token ids are queued at once and\n"
          "run to completion (EOS ignored). Reports tokens/s, TTFT and TPOT percentiles, KV usage and\n"
          "waste, prefix-cache hit rate and preemptions.\n\n"
          "  --num-prompts N               requests (default %d)\n"
          "  --input-len N                 prompt tokens (default %d)\n"
          "  --output-len N                generated tokens per request (default %d)\n"
          "  --random-range-ratio R        lengths uniform in [len*(1-R), len*(1+R)] (default %g: fixed)\n"
          "  --shared-prefix-len N         the first N prompt tokens are the same in every request (default %d;\n"
          "                                less than --input-len)\n"
          "  --temperature T               default %g (0: greedy)\n"
          "  --seed S                      prompts and sampling seed (default %lld)\n"
          "  --json                        print one JSON object on stdout\n\n",
          o->num_prompts, o->input_len, o->output_len, o->ratio, o->shared, o->temp, o->seed);
  engine_flags_usage(f, ep);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t next_rand(uint64_t *s) { /* xorshift64*: prompts only, not sampling */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted V (n > 0). */
static double pct(const double *v, int n, double q) {
  int k = (int)(q / 100.0 * n + 0.999999);
  if (k < 1)
    k = 1;
  return v[k > n ? n - 1 : k - 1];
}

static int len_of(int base, double ratio, uint64_t *rng) {
  if (ratio <= 0)
    return base;
  int lo = (int)(base * (1 - ratio)), hi = (int)(base * (1 + ratio));
  if (lo < 1)
    lo = 1;
  return lo + (int)(next_rand(rng) % (uint64_t)(hi - lo + 1));
}

int cli_bench(int argc, char **argv) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  struct bench_opts o = {.num_prompts = 64, .input_len = 256, .output_len = 128, .temp = 1};
  int r;
  const char *v;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout, &o, &ep);
      return 0;
    }
    if ((r = engine_flags_parse(&ep, argc, argv, &i)) != 0) {
      if (r < 0)
        return 2;
      continue;
    }
    if (!strcmp(a, "--json"))
      o.json = 1;
    else ON_FLAG("--num-prompts", &i, 2) { if (flag_int("--num-prompts", v, 1, 1 << 24, &o.num_prompts)) return 2; }
    else ON_FLAG("--input-len", &i, 2) { if (flag_int("--input-len", v, 1, 1 << 24, &o.input_len)) return 2; }
    else ON_FLAG("--output-len", &i, 2) { if (flag_int("--output-len", v, 1, 1 << 24, &o.output_len)) return 2; }
    else ON_FLAG("--shared-prefix-len", &i, 2) { if (flag_int("--shared-prefix-len", v, 0, 1 << 24, &o.shared)) return 2; }
    else ON_FLAG("--random-range-ratio", &i, 2) { if (flag_double("--random-range-ratio", v, 0, 0.999, &o.ratio)) return 2; }
    else ON_FLAG("--temperature", &i, 2) { if (flag_double("--temperature", v, 0, 100, &o.temp)) return 2; }
    else ON_FLAG("--seed", &i, 2) { if (flag_int64("--seed", v, 0, 0x7fffffffffffffffLL, &o.seed)) return 2; }
    else {
      fprintf(stderr, "error: unknown option '%s' (see pagoda bench --help)\n", a);
      return 2;
    }
  }
  if (o.shared >= o.input_len) { /* every prompt keeps at least one token of its own */
    fprintf(stderr, "error: --shared-prefix-len %d must be less than --input-len %d: lower it or raise --input-len\n",
            o.shared, o.input_len);
    return 2;
  }
  if (engine_flags_check(&ep))
    return 2;
  int worker_rc; /* --tp-rank > 0: this process serves rank 0's model calls instead */
  if (cli_tp_worker(&ep, &worker_rc))
    return worker_rc;
  int num_prompts = o.num_prompts, input_len = o.input_len, output_len = o.output_len, shared = o.shared,
      json = o.json;
  double ratio = o.ratio, temp = o.temp;
  long long seed = o.seed;
  pagoda_engine_t *e;
  if (pagoda_engine_create(&ep, &e)) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    return 1;
  }
  int vocab = pagoda_vocab_size(e), rc = 1;
  uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)seed;
  int max_in = (int)(input_len * (1 + ratio)) + 1;
  if (max_in < shared + 1)
    max_in = shared + 1;
  int32_t *prompt = malloc((size_t)max_in * sizeof *prompt), *prefix = malloc((size_t)(shared + 1) * sizeof *prefix);
  uint64_t *ids = malloc((size_t)num_prompts * sizeof *ids);
  double *t_first = calloc((size_t)num_prompts, sizeof(double)), *t_last = calloc((size_t)num_prompts, sizeof(double));
  int *num_out = calloc((size_t)num_prompts, sizeof(int));
  uint64_t *digest = calloc((size_t)num_prompts, sizeof(uint64_t)); /* FNV-1a of each request's tokens */
  double *ttft = malloc((size_t)num_prompts * sizeof(double)), *tpot = malloc((size_t)num_prompts * sizeof(double));
  if (!prompt || !prefix || !ids || !t_first || !t_last || !num_out || !digest || !ttft || !tpot) {
    fprintf(stderr, "error: out of memory\n");
    goto done;
  }
  /* Token ids from 3 up: skips the usual unk/bos/eos ids; the rest of the vocabulary is fair. */
  for (int i = 0; i < shared; i++)
    prefix[i] = 3 + (int32_t)(next_rand(&rng) % (uint64_t)(vocab - 3));
  long long in_tokens = 0;
  double t0 = now_s();
  for (int k = 0; k < num_prompts; k++) {
    int in = len_of(input_len, ratio, &rng), out = len_of(output_len, ratio, &rng);
    if (in < shared + 1)
      in = shared + 1;
    memcpy(prompt, prefix, (size_t)shared * sizeof *prompt);
    for (int i = shared; i < in; i++)
      prompt[i] = 3 + (int32_t)(next_rand(&rng) % (uint64_t)(vocab - 3));
    struct pagoda_sampling_params sp;
    pagoda_sampling_params_default(&sp);
    sp.temperature = (float)temp;
    sp.seed = seed + k;
    sp.max_tokens = out;
    sp.ignore_eos = 1;
    if (pagoda_add_request_tokens(e, prompt, in, &sp, &ids[k])) {
      fprintf(stderr, "error: request %d (%d + %d tokens): %s\n", k, in, out, pagoda_last_error());
      goto done;
    }
    in_tokens += in;
  }
  long long out_tokens = 0;
  while (pagoda_engine_has_work(e)) {
    const struct pagoda_output *outs;
    int n;
    if (pagoda_engine_step(e, &outs, &n)) {
      fprintf(stderr, "error: %s\n", pagoda_last_error());
      goto done;
    }
    double t = now_s();
    for (int i = 0; i < n; i++) {
      if (!outs[i].num_token_ids)
        continue;
      int lo = 0, hi = num_prompts - 1; /* ids ascend with submission order */
      while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ids[mid] < outs[i].request_id)
          lo = mid + 1;
        else
          hi = mid;
      }
      if (!num_out[lo])
        t_first[lo] = t;
      t_last[lo] = t;
      num_out[lo] += outs[i].num_token_ids;
      for (int j = 0; j < outs[i].num_token_ids; j++)
        digest[lo] = (digest[lo] ^ (uint32_t)outs[i].token_ids[j]) * 0x100000001b3ull;
      out_tokens += outs[i].num_token_ids;
    }
  }
  double elapsed = now_s() - t0;
  int num_tpot = 0;
  for (int k = 0; k < num_prompts; k++) {
    ttft[k] = (t_first[k] - t0) * 1e3;
    if (num_out[k] > 1)
      tpot[num_tpot++] = (t_last[k] - t_first[k]) * 1e3 / (num_out[k] - 1);
  }
  qsort(ttft, (size_t)num_prompts, sizeof *ttft, cmp_double);
  qsort(tpot, (size_t)num_tpot, sizeof *tpot, cmp_double);
  struct pagoda_engine_stats st;
  pagoda_engine_stats(e, &st);
  double hit_rate = st.prefix_queries ? (double)st.prefix_hits / (double)st.prefix_queries : 0;
  double shared_hit = shared ? (double)st.prefix_hits / ((double)shared * num_prompts) : 0;
  double p50_tpot = num_tpot ? pct(tpot, num_tpot, 50) : 0, p99_tpot = num_tpot ? pct(tpot, num_tpot, 99) : 0;
  uint64_t all = 0xcbf29ce484222325ull; /* the requests' digests in submission order */
  for (int k = 0; k < num_prompts; k++)
    all = (all ^ digest[k]) * 0x100000001b3ull;
  if (json) {
    printf("{\"output_digest\": \"%016llx\", ", (unsigned long long)all);
    printf("\"requests\": %d, \"input_tokens\": %lld, \"output_tokens\": %lld, \"elapsed_s\": %.6f, "
           "\"requests_per_s\": %.4f, \"output_tok_per_s\": %.2f, \"total_tok_per_s\": %.2f, "
           "\"ttft_ms\": {\"p50\": %.3f, \"p99\": %.3f}, \"tpot_ms\": {\"p50\": %.4f, \"p99\": %.4f}, "
           "\"kv_peak_usage\": %.4f, \"kv_waste_fraction\": %.5f, \"prefix_cache_hit_rate\": %.4f, "
           "\"prefix_cache_hit_tokens\": %lld, \"shared_prefix_hit_fraction\": %.4f, "
           "\"prompt_tokens_computed\": %lld, \"preemptions\": %lld, \"kv_blocks\": %d, \"block_size\": %d, "
           "\"steps\": %lld}\n",
           num_prompts, in_tokens, out_tokens, elapsed, num_prompts / elapsed, out_tokens / elapsed,
           (in_tokens + out_tokens) / elapsed, pct(ttft, num_prompts, 50), pct(ttft, num_prompts, 99), p50_tpot,
           p99_tpot, st.kv_peak_usage, st.kv_waste_fraction, hit_rate, (long long)st.prefix_hits, shared_hit,
           (long long)st.prompt_tokens_computed, (long long)st.preemptions, st.num_blocks, st.block_size,
           (long long)st.steps);
  } else {
    printf("requests: %d in %.3f s (%.2f req/s)\n", num_prompts, elapsed, num_prompts / elapsed);
    printf("tokens: %lld input, %lld output; %.1f output tok/s, %.1f total tok/s\n", in_tokens, out_tokens,
           out_tokens / elapsed, (in_tokens + out_tokens) / elapsed);
    printf("TTFT ms: p50 %.2f p99 %.2f; TPOT ms: p50 %.3f p99 %.3f\n", pct(ttft, num_prompts, 50),
           pct(ttft, num_prompts, 99), p50_tpot, p99_tpot);
    printf("KV: %d blocks of %d, peak usage %.1f%%, waste %.2f%%; preemptions %lld\n", st.num_blocks, st.block_size,
           100 * st.kv_peak_usage, 100 * st.kv_waste_fraction, (long long)st.preemptions);
    printf("prefix cache: hit rate %.1f%% (%lld of %lld prompt tokens); prompt tokens computed %lld\n",
           100 * hit_rate, (long long)st.prefix_hits, (long long)st.prefix_queries,
           (long long)st.prompt_tokens_computed);
  }
  if (fflush(stdout) || ferror(stdout)) {
    fprintf(stderr, "error: cannot write the results to stdout: %s\n", strerror(errno ? errno : EIO));
    goto done;
  }
  rc = 0;
done:
  free(prompt);
  free(prefix);
  free(ids);
  free(t_first);
  free(t_last);
  free(num_out);
  free(digest);
  free(ttft);
  free(tpot);
  pagoda_engine_free(e);
  return rc;
}
