/* test_engine_tp.c - the engine at --tp 2 and --tp 4 (params.tp, and PAGODA_TP) on the CPU
 * backend (ranks are threads, cpu_comm.c's all_reduce_sum and gather_cols) gives the same tokens
 * as --tp 1: greedy and seeded sampling, n = 2 (copy-on-write of KV blocks on every rank), prefix
 * caching, mixed steps. Real model: ../shared/testdata/models/stories260K.gguf (8 heads, 4 KV
 * heads: --tp 4 splits them one per rank; --tp 8 would replicate); then every fixture model the
 * engine can load (fixtures[] below: every architecture, KV heads replicated at --tp 4, the
 * vocabulary-parallel head). Also: --tp 3 is refused with a message naming --tp, and
 * PAGODA_TP=abc with one naming the variable. The logits of --tp N differ from
 * --tp 1 only by f32 summation order (test_tp_cpu: rel L2 ~3e-7), far below any margin these
 * tokens are chosen by. */
#define _DEFAULT_SOURCE /* symlink, mkdtemp */
#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

#include "engine_runs.h"

/* The fixture models the engine can load (a tokenizer is needed: the HF directories get
 * mistral_sw's byte-level tokenizer.json, 256 tokens, beside their files; the GGUFs of phi3 and
 * qwen3 carry a placeholder vocabulary; gemma2.gguf and mixtral.gguf have none, and
 * test_tp_cpu covers their layouts). All have vocabulary 256, 4 query heads (mistral 8), 2 KV
 * heads (llama 4) and ffn widths divisible by 4. */
static const char *const fixtures[] = {"llama",      "llama3",    "llama_hd", "llama_bf16", "llama_sharded",
                                       "mistral",    "mistral_sw", "qwen2",   "qwen3",      "qwen3/model.gguf",
                                       "phi3",       "phi3/model.gguf", "gemma2", "mixtral"};

/* DIR (a fresh temporary directory) gets links to every file of fixture directory SRC, plus
 * mistral_sw's tokenizer.json when SRC has none. 0 or -1. */
static int link_fixture(const char *src, const char *tok, char *dir) {
  DIR *d = opendir(src);
  if (!d || !mkdtemp(dir)) {
    if (d)
      closedir(d);
    return -1;
  }
  char from[2048], to[2048];
  int rc = 0, has_tok = 0;
  for (struct dirent *de; (de = readdir(d)) != NULL;) {
    if (de->d_name[0] == '.')
      continue;
    has_tok |= !strcmp(de->d_name, "tokenizer.json");
    snprintf(from, sizeof from, "%s/%s", src, de->d_name);
    snprintf(to, sizeof to, "%s/%s", dir, de->d_name);
    if (symlink(from, to))
      rc = -1;
  }
  closedir(d);
  snprintf(to, sizeof to, "%s/tokenizer.json", dir);
  if (!has_tok && symlink(tok, to))
    rc = -1;
  return rc;
}

static void unlink_fixture(const char *dir) {
  DIR *d = opendir(dir);
  char p[2048];
  for (struct dirent *de; d && (de = readdir(d)) != NULL;) {
    if (de->d_name[0] == '.')
      continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    unlink(p);
  }
  if (d)
    closedir(d);
  rmdir(dir);
}

/* Every fixture model through the engine at --tp 2 and 4 against --tp 1: the request mix of
 * engine_runs.h with its prompts cut to 20 tokens (ids mod 256; the even requests still share
 * their first 20 tokens) so that prompt and 40 output tokens fit phi3's 64 positions. */
static void fixtures_tp(void) {
  static struct result ref, got;
  struct pagoda_engine_stats st;
  char tok[1024], src[1024];
  const char *t = test_fixture_path("mistral_sw/tokenizer.json");
  if (!t) {
    CHECK(0, "tests/fixtures/mistral_sw/tokenizer.json not found");
    return;
  }
  snprintf(tok, sizeof tok, "%s", t);
  if (tok[0] != '/') { /* the links must resolve from /tmp */
    char cwd[512];
    snprintf(src, sizeof src, "%s/%s", getcwd(cwd, sizeof cwd) ? cwd : ".", t);
    snprintf(tok, sizeof tok, "%s", src);
  }
  make_prompts();
  for (int r = 0; r < NREQ; r++) {
    if (prompt_len[r] > 20)
      prompt_len[r] = 20;
    for (int i = 0; i < prompt_len[r]; i++)
      prompts[r][i] %= 256;
  }
  for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
    const char *p = test_fixture_path(fixtures[f]);
    char cwd[512], dir[] = "/tmp/pagoda_engine_tpXXXXXX", model[1200];
    if (!p) {
      CHECK(0, "fixture %s not found", fixtures[f]);
      continue;
    }
    if (p[0] == '/')
      snprintf(src, sizeof src, "%s", p);
    else
      snprintf(src, sizeof src, "%s/%s", getcwd(cwd, sizeof cwd) ? cwd : ".", p);
    int gguf = strstr(src, ".gguf") != NULL;
    if (gguf) {
      snprintf(model, sizeof model, "%s", src);
    } else {
      if (link_fixture(src, tok, dir)) {
        CHECK(0, "%s: linking into %s failed", fixtures[f], dir);
        unlink_fixture(dir);
        continue;
      }
      snprintf(model, sizeof model, "%s", dir);
    }
    struct pagoda_engine_params base;
    pagoda_engine_params_default(&base);
    base.model = model;
    base.device = "cpu";
    base.threads = 1;
    base.max_num_seqs = 8;
    base.max_model_len = 64;
    base.block_size = 8;
    base.pa_memory_mb = 4;
    base.prefill_chunk_size = 8;
    base.max_num_batched_tokens = 21; /* mixed steps */
    base.cache_type = PAGODA_CACHE_TYPE_F32;
    base.tp = 1;
    int failures = test_failures;
    if (run(&base, 0, &ref, &st) == 0) {
      int outputs = 0;
      for (int r = 0; r < NREQ; r++)
        outputs += ref.n[r][0] >= 1 && ref.finish[r][0] != 0;
      CHECK(outputs == NREQ, "%s: %d of %d requests finished with output at --tp 1", fixtures[f], outputs, NREQ);
      for (int w = 2; w <= 4; w += 2) {
        char what[128];
        struct pagoda_engine_params p2 = base;
        p2.tp = w;
        snprintf(what, sizeof what, "%s --tp %d", fixtures[f], w);
        if (run(&p2, 0, &got, &st) == 0)
          compare(what, &ref, &got);
      }
      if (test_failures == failures)
        printf("%s: --tp 2 and --tp 4 gave --tp 1's tokens\n", fixtures[f]);
    }
    if (!gguf)
      unlink_fixture(dir);
  }
}

int main(void) {
  struct pagoda_engine_params base;
  if (test_stories_params(&base, 16, 512))
    return test_skip("stories260K.gguf not found");
  make_prompts();
  base.prefill_chunk_size = 32;
  base.max_num_batched_tokens = 69; /* mixed steps */
  base.tp = 1;
  static struct result ref, got;
  struct pagoda_engine_stats st;
  if (run(&base, 0, &ref, &st))
    return test_finish("test_engine_tp");
  for (int r = 0; r < NREQ; r++)
    CHECK(ref.n[r][0] >= 1 && ref.finish[r][0] != 0, "request %d finished with output", r);
  struct pagoda_engine_params p = base;
  p.tp = 2;
  run(&p, 0, &got, &st);
  compare("--tp 2", &ref, &got);
  p.tp = 4;
  run(&p, 0, &got, &st);
  compare("--tp 4", &ref, &got);
  p.tp = 0; /* PAGODA_TP */
  setenv("PAGODA_TP", "2", 1);
  run(&p, 0, &got, &st);
  compare("PAGODA_TP=2", &ref, &got);
  pagoda_engine_t *e = NULL;
  setenv("PAGODA_TP", "abc", 1);
  CHECK(pagoda_engine_create(&p, &e) != PAGODA_OK && strstr(pagoda_last_error(), "PAGODA_TP"),
        "PAGODA_TP=abc refused naming the variable: %s", pagoda_last_error());
  unsetenv("PAGODA_TP");
  p.tp = 3;
  CHECK(pagoda_engine_create(&p, &e) != PAGODA_OK && strstr(pagoda_last_error(), "--tp 3"),
        "--tp 3 (8 heads) refused naming --tp 3: %s", pagoda_last_error());
  fixtures_tp();
  return test_finish("test_engine_tp");
}
