/* test_tp_cuda.c - tensor parallelism on the CUDA backend over NCCL: every llama-family fixture at
 * --tp 2 against --tp 1 (tests/c/tp_common.h): logits within the bf16 tolerance, greedy tokens
 * equal. Both runs are bf16; they differ in where the partial sums of o_proj / down_proj are
 * rounded to bf16 (each rank's, then NCCL's sum), which test_cuda_model's TOL_MODEL (4e-2, for
 * bf16 against f32) bounds with room. Skips (77) without NCCL in the build or with fewer than 2
 * GPUs. */
#include "c/tp_common.h"

#define TOL 4e-2

int main(void) {
  if (!backend_device_available("cuda"))
    return test_skip("no usable GPU");
  struct backend_params bp = {"cuda", 0, 1};
  struct backend *be = backend_create(&bp);
  if (!be) {
    char why[512];
    snprintf(why, sizeof why, "tensor parallelism needs 2 GPUs: %s", err_last());
    return test_skip(why);
  }
  int nccl = be->ops->all_reduce_sum != NULL;
  be->ops->destroy(be);
  if (!nccl)
    return test_skip("this build's CUDA backend has no NCCL (tensor parallelism off)");
  static const char *const names[] = {"llama", "llama3", "llama_hd", "mistral", "qwen2", "qwen3", "llama_bf16"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    tpc_check_fixture("cuda", names[i], 2, TOL);
  return test_finish("test_tp_cuda");
}
