/* test_tp_cuda.c - tensor parallelism on the CUDA backend over NCCL: every fixture model of
 * tests/c/tp_common.h's list (llama family, mistral_sw, qwen3, phi3, gemma2, mixtral; HF
 * directories and GGUF files) at --tp 2 against --tp 1: logits within the bf16 tolerance, greedy
 * tokens equal, the output head vocabulary-parallel (128 rows per GPU, ncclSend/ncclRecv to GPU
 * 0). Both runs are bf16; they differ in where the partial sums of o_proj / down_proj / the MoE
 * block are rounded to bf16 (each rank's, then NCCL's sum), which test_cuda_model's TOL_MODEL
 * (4e-2, for bf16 against f32) bounds with room.
 * Mixtral: a token whose k-th and (k+1)-th router logits are closer than that rounding moves
 * them may go to another expert on one run and not the other (test_cuda_archops_model.c), so
 * its prompt stops before the first router gap < GAP_BF16 (router_gaps.json: position 10).
 * Skips (77) without NCCL in the build or with fewer than 2 GPUs. */
#include "c/tp_common.h"

#define TOL 4e-2
#define GAP_BF16 0.05

/* The first position of fixture NAME's prompt whose router gap (NAME/router_gaps.json) is below
 * GAP_BF16 in some layer; 0 (no cut) for a model without the file, -1 when it cannot be read. */
static int first_near_tie(const char *name) {
  char p[1100], dir[1024];
  snprintf(dir, sizeof dir, "%s", name);
  char *dot = strstr(dir, ".gguf");
  if (dot)
    *dot = 0; /* NAME.gguf: the gaps are in NAME/ */
  const char *d = test_fixture_path(dir);
  snprintf(p, sizeof p, "%s/router_gaps.json", d ? d : dir);
  size_t len;
  char *t = test_read_file(p, &len);
  if (!t)
    return 0;
  cJSON *j = cJSON_Parse(t), *gaps = j ? cJSON_GetObjectItem(j, "gaps") : NULL;
  int first = cJSON_IsArray(gaps) ? 256 : -1;
  for (int layer = 0; first >= 0 && layer < cJSON_GetArraySize(gaps); layer++) {
    const cJSON *row = cJSON_GetArrayItem(gaps, layer);
    for (int i = 0; i < cJSON_GetArraySize(row); i++)
      if (cJSON_GetArrayItem(row, i)->valuedouble < GAP_BF16 && i < first)
        first = i;
  }
  cJSON_Delete(j);
  free(t);
  return first;
}

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
  for (int i = 0; i < TPC_N_MODELS; i++) {
    int cut = first_near_tie(tpc_models[i].name);
    CHECK(cut >= 0, "%s: cannot read router_gaps.json", tpc_models[i].name);
    if (cut > 0)
      printf("%s: the prompt's first %d tokens (before the first router gap < %.2f)\n", tpc_models[i].name, cut,
             GAP_BF16);
    if (cut >= 0)
      tpc_check_listed("cuda", i, 2, TOL, cut);
  }
  return test_finish("test_tp_cuda");
}
