/* test_engine_tp.c - the engine at --tp 2 and --tp 4 (params.tp, and PAGODA_TP) on the CPU
 * backend (ranks are threads, cpu_comm.c's all_reduce_sum) gives the same tokens as --tp 1: greedy
 * and seeded sampling, n = 2 (copy-on-write of KV blocks on every rank), prefix caching, mixed
 * steps. Real model: ../shared/testdata/models/stories260K.gguf (8 heads, 4 KV heads: --tp 4
 * splits them one per rank; --tp 8 would replicate). Also: --tp 3 is refused with a message
 * naming --tp, and PAGODA_TP=abc with one naming the variable. The logits of --tp N differ from
 * --tp 1 only by f32 summation order (test_tp_cpu: rel L2 ~3e-7), far below any margin these
 * tokens are chosen by. */
#include "engine_runs.h"

int main(void) {
  const char *model = test_shared_path("models/stories260K.gguf");
  if (!model)
    return test_skip("stories260K.gguf not found");
  make_prompts();
  struct pagoda_engine_params base;
  pagoda_engine_params_default(&base);
  base.model = model;
  base.device = "cpu";
  base.threads = 1;
  base.max_num_seqs = 16;
  base.max_model_len = 512;
  base.pa_memory_mb = 16;
  base.prefill_chunk_size = 32;
  base.max_num_batched_tokens = 69; /* mixed steps */
  base.cache_type = PAGODA_CACHE_TYPE_F32;
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
  return test_finish("test_engine_tp");
}
