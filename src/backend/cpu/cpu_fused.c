/* cpu_fused.c - the CPU backend's fused ops (backend.h, "Fused small ops"): each is the
 * sequence of separate ops it stands for, so these are the reference the CUDA kernels are
 * checked against and the CPU forward pass runs through the same calls as the GPU one.
 * matmul_silu_mul is left out (NULL): its sequence needs a second (T, F) buffer, which the
 * model's fallback (blocks.c) has and the CPU backend does not allocate. */
#include "backend/cpu/cpu_backend.h"
#include "util/log.h"

int cpu_matmul_n(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                 const struct weight *const ws[], const struct weight *const biases[], int T) {
  if (n < 1 || n > BACKEND_MATMUL_N_MAX)
    return ERR("matmul_n: n = %d (1..%d)", n, BACKEND_MATMUL_N_MAX);
  for (int i = 0; i < n; i++)
    if (ws[i]->cols != ws[0]->cols)
      return ERR("matmul_n: weight %d has %lld columns, weight 0 has %lld", i, (long long)ws[i]->cols,
                 (long long)ws[0]->cols);
  if (pre) {
    if (cpu_rmsnorm(be, pre->xn, NULL, x, pre->w, T, (int)ws[0]->cols, pre->eps))
      return -1;
    x = pre->xn;
  }
  for (int i = 0; i < n; i++)
    if (cpu_matmul(be, outs[i], x, ws[i], biases ? biases[i] : NULL, T, 0))
      return -1;
  return 0;
}

/* resid += the product, as rmsnorm's residual add does it (f32). */
static void add_into(float *resid, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    resid[i] += x[i];
}

int cpu_matmul_add(struct backend *be, void *resid, const void *x, const struct weight *w, void *scratch, int T) {
  if (cpu_matmul(be, scratch, x, w, NULL, T, 0))
    return -1;
  add_into(resid, scratch, (size_t)T * w->rows);
  return 0;
}

int cpu_all_reduce_add(struct backend *be, void *resid, void *x, size_t n) {
  if (cpu_all_reduce_sum(be, x, n))
    return -1;
  add_into(resid, x, n);
  return 0;
}

int cpu_rope_kv_write(struct backend *be, void *q, void *k, const void *v, const struct kv_layer *kv,
                      const struct batch *b, int n_heads, const struct rope_params *rp) {
  if (cpu_rope(be, q, k, b->positions, b->num_tokens, n_heads, kv->n_kv_heads, kv->head_dim, rp))
    return -1;
  return cpu_kv_write(be, kv, k, v, b);
}

int cpu_matmul_qkv_rope(struct backend *be, void *q, void *k, void *v, const void *x, const struct backend_prenorm *pre,
                        const struct weight *const ws[3], const struct weight *const biases[3], const struct kv_layer *kv,
                        const struct batch *b, int n_heads, const struct rope_params *rp) {
  void *const outs[3] = {q, k, v};
  if (cpu_matmul_n(be, 3, outs, x, pre, ws, biases, b->num_tokens))
    return -1;
  return cpu_rope_kv_write(be, q, k, v, kv, b, n_heads, rp);
}
