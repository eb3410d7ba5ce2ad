/* test_tp_cpu.c - tensor parallelism on the CPU backend (ranks are threads; cpu_comm.c's
 * all_reduce_sum sums in rank order): every llama-family fixture split 2 ways, and 4 ways where
 * the heads allow (mistral: 2 KV heads over 4 ranks, replicated as vLLM), against the unsplit
 * model. f32 throughout, so only summation order differs: rel L2 < 1e-5 (as
 * test_model_fixtures). Also: shapes that do not divide and unsupported architectures are
 * refused with a message naming --tp. */
#include "c/tp_common.h"

#define TOL 1e-5

int main(void) {
  if (!test_fixture_path("llama"))
    return test_skip("no tests/fixtures");
  /* fixture, ranks: the llama family's shapes (MHA, GQA, tied head, biases, head_dim != dim /
   * heads, q/k norms) */
  static const struct {
    const char *name;
    int world;
  } cases[] = {{"llama", 2}, {"llama", 4}, {"llama3", 2}, {"llama_hd", 2}, {"mistral", 2}, {"mistral", 4},
               {"qwen2", 2}, {"qwen3", 2}, {"llama_sharded", 2}, {"llama_bf16", 2}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    tpc_check_fixture("cpu", cases[i].name, cases[i].world, TOL);

  /* refused: 3 does not divide 4 heads; phi3 (fused projections) is not split */
  struct tpc_run r = {0};
  int32_t tokens[256];
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", test_fixture_path("llama"));
  int n = tpc_tokens(dir, tokens);
  CHECK(tpc_run("cpu", dir, 3, tokens, n, &r) != 0 && strstr(err_last(), "--tp 3"),
        "llama at --tp 3 should be refused naming --tp 3: %s", err_last());
  tpc_free(&r);
  snprintf(dir, sizeof dir, "%s", test_fixture_path("phi3"));
  n = tpc_tokens(dir, tokens);
  CHECK(n > 0 && tpc_run("cpu", dir, 2, tokens, n, &r) != 0 && strstr(err_last(), "phi3"),
        "phi3 at --tp 2 should be refused naming the architecture: %s", err_last());
  tpc_free(&r);
  return test_finish("test_tp_cpu");
}
