/* test_tp_cpu.c - tensor parallelism on the CPU backend (ranks are threads; cpu_comm.c's
 * all_reduce_sum sums in rank order, gather_cols copies): every fixture model of tp_common.h's
 * list (llama family, mistral_sw, qwen3, phi3, gemma2, mixtral; HF directories and GGUF files)
 * split 2 and 4 ways against the unsplit model. All have 4 query heads (mistral 8) and 2 KV heads
 * (llama 4), ffn widths divisible by 4 and vocabulary 256, so 4 ranks take one query head each
 * and replicate the KV heads (two ranks per KV head, as vLLM), and the output head is
 * vocabulary-parallel (64 or 128 rows per rank, gathered to rank 0). f32 throughout, so only
 * the summation order of the all-reduces differs: rel L2 < 1e-5 (as test_model_fixtures;
 * measured values printed) and greedy tokens equal.
 * Also: shapes that do not divide are refused with a message naming --tp. */
#include "c/tp_common.h"

#define TOL 1e-5

int main(void) {
  if (!test_fixture_path("llama"))
    return test_skip("no tests/fixtures");
  static const int worlds[] = {2, 4};
  for (int i = 0; i < TPC_N_MODELS; i++)
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
      tpc_check_listed("cpu", i, worlds[w], TOL);

  /* refused: 3 does not divide 4 heads */
  struct tpc_run r = {0};
  int32_t tokens[256];
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", test_fixture_path("llama"));
  int n = tpc_tokens(dir, tokens);
  CHECK(tpc_run("cpu", dir, 3, tokens, n, &r) != 0 && strstr(err_last(), "--tp 3"),
        "llama at --tp 3 should be refused naming --tp 3: %s", err_last());
  tpc_free(&r);
  return test_finish("test_tp_cpu");
}
