/* test_engine_invariance.c - outputs do not depend on batching: the same requests with the same
 * seeds give the same tokens run one at a time, all at once, with chunked prefill at several
 * chunk sizes and small token budgets (mixed steps), with prefix caching on or off, at other
 * block sizes, and on a tiny pool that forces preemption. Greedy and seeded sampling (T 0.8),
 * n = 2 samples included. Real model: ../shared/testdata/models/stories260K.gguf. */
#include "engine_runs.h"

int main(void) {
  struct pagoda_engine_params base;
  if (test_stories_params(&base, 16, 512))
    return test_skip("stories260K.gguf not found");
  make_prompts();
  /* the pool sizes below count f32 blocks (test_stories_params: an f32 cache) */
  static struct result ref, got;
  struct pagoda_engine_stats st;
  if (run(&base, 1, &ref, &st))
    return test_finish("test_engine_invariance");
  for (int r = 0; r < NREQ; r++)
    CHECK(ref.n[r][0] >= 1 && ref.finish[r][0] != 0, "request %d finished with output", r);
  CHECK(ref.n[4][1] == MAXOUT, "the second sample of request 4 ran");
  CHECK(memcmp(ref.tokens[4][0], ref.tokens[4][1], MAXOUT * 4) != 0, "the two samples differ");
  CHECK(st.prefix_hits > 0, "one at a time, the shared prefix is served from the cache (%lld)",
        (long long)st.prefix_hits);

  run(&base, 0, &got, &st);
  compare("all at once", &ref, &got);

  const int chunks[3] = {7, 32, 100};
  for (int c = 0; c < 3; c++) {
    struct pagoda_engine_params p = base;
    p.prefill_chunk_size = chunks[c];
    p.max_num_batched_tokens = 2 * chunks[c] + 5; /* mixed steps: decodes beside prompt chunks */
    run(&p, 0, &got, &st);
    char what[64];
    snprintf(what, sizeof what, "chunk %d", chunks[c]);
    compare(what, &ref, &got);
  }
  struct pagoda_engine_params p = base;
  p.prefix_cache_n = 0;
  run(&p, 0, &got, &st);
  compare("prefix cache off", &ref, &got);
  CHECK(st.prefix_hits == 0, "no hits with the cache off");
  p = base;
  p.block_size = 8;
  run(&p, 1, &got, &st);
  compare("block size 8", &ref, &got);

  /* Tiny pool: 1 MiB of 20 KiB blocks (16 tokens) = 51 blocks, 32 of them one full context. */
  p = base;
  p.block_size = 16;
  p.pa_memory_mb = 1;
  run(&p, 0, &got, &st);
  compare("tiny pool", &ref, &got);
  CHECK(st.preemptions > 0, "the tiny pool preempted (%lld)", (long long)st.preemptions);
  p.prefix_cache_n = 0;
  p.prefill_chunk_size = 32;
  run(&p, 0, &got, &st);
  compare("tiny pool, no prefix cache, chunk 32", &ref, &got);
  CHECK(st.preemptions > 0, "preempted (%lld)", (long long)st.preemptions);

  /* --paged-attn off: contiguous regions with the sequence-level prefix cache, then one region
   * only (the requests run one after another). */
  p = base;
  p.paged_attn = PAGODA_PAGED_ATTN_OFF;
  run(&p, 0, &got, &st);
  compare("paged-attn off", &ref, &got);
  CHECK(st.paged == 0, "contiguous cache in use");
  run(&p, 1, &got, &st);
  compare("paged-attn off, one at a time", &ref, &got);
  CHECK(st.prefix_hits > 0, "the sequence-level cache hit (%lld)", (long long)st.prefix_hits);
  p.block_size = 16;
  p.pa_memory_mb = 1;
  run(&p, 0, &got, &st);
  compare("paged-attn off, one region", &ref, &got);
  CHECK(st.num_blocks == 50 && st.kv_peak_usage < 0.7, "one region of 32 blocks: %d blocks, peak %.2f",
        st.num_blocks, st.kv_peak_usage);

  /* The f16 cache (the default for GGUF on CPU) is batch-invariant too. */
  static struct result ref16;
  p = base;
  p.cache_type = PAGODA_CACHE_TYPE_F16;
  run(&p, 1, &ref16, &st);
  run(&p, 0, &got, &st);
  compare("f16 cache, all at once", &ref16, &got);
  p.prefill_chunk_size = 7;
  p.max_num_batched_tokens = 19;
  run(&p, 0, &got, &st);
  compare("f16 cache, chunk 7", &ref16, &got);
  return test_finish("test_engine_invariance");
}
