/* test_cpu_moe_act.c - the CPU backend's Gemma 2 / Mixtral ops against direct formulas in double:
 * GeGLU with the tanh GELU, scale, logit softcapping, MoE routing (top-k of a softmax,
 * renormalised, rows grouped by expert) and the whole MoE block (moe_ffn) against a dense
 * per-token loop over the chosen experts, with f32 and q8_0 expert weights.
 * Tolerance: 1e-5 relative L2 (f32 accumulation over at most a few hundred terms). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/moe_block.h"
#include "test_util.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/quant.h"

#define TOL 1e-5

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float *rand_floats(size_t n, float scale) {
  float *p = malloc(n * sizeof *p + 4);
  for (size_t i = 0; i < n; i++)
    p[i] = test_randf(&rng) * scale;
  return p;
}

static double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_elementwise(struct backend *be) {
  int T = 7, F = 300;
  size_t n = (size_t)T * F;
  float *g = rand_floats(n, 4.0f), *u = rand_floats(n, 2.0f), *out = malloc(n * 4);
  float *ref = malloc(n * 4);
  for (size_t i = 0; i < n; i++)
    ref[i] = (float)(gelu_tanh_ref(g[i]) * u[i]);
  CHECK(be->ops->gelu_tanh_mul(be, out, g, u, T, F) == 0, "gelu_tanh_mul: %s", err_last());
  CHECK(test_rel_l2(out, ref, n) < TOL, "gelu_tanh_mul rel L2 %g", test_rel_l2(out, ref, n));
  /* known values: gelu_tanh(1) = 0.841191990..., gelu_tanh(-3) = -0.003637392... */
  float g2[2] = {1.0f, -3.0f}, u2[2] = {1.0f, 1.0f}, o2[2];
  be->ops->gelu_tanh_mul(be, o2, g2, u2, 1, 2);
  CHECK(fabs(o2[0] - 0.8411919906) < 1e-6 && fabs(o2[1] + 0.0036373920) < 1e-7, "gelu_tanh(1) = %.9f, (-3) = %.9f",
        o2[0], o2[1]);
  /* in place (out aliases gate) */
  CHECK(be->ops->gelu_tanh_mul(be, g, g, u, T, F) == 0, "aliased");
  CHECK(test_rel_l2(g, ref, n) < TOL, "gelu_tanh_mul in place rel L2 %g", test_rel_l2(g, ref, n));

  float *x = rand_floats(n, 30.0f), *xs = malloc(n * 4);
  memcpy(xs, x, n * 4);
  float cap = 15.0f;
  for (size_t i = 0; i < n; i++)
    ref[i] = (float)(cap * tanh((double)x[i] / cap));
  CHECK(be->ops->softcap(be, x, T, F, cap) == 0, "softcap");
  CHECK(test_rel_l2(x, ref, n) < TOL, "softcap rel L2 %g", test_rel_l2(x, ref, n));
  float big = 1e6f;
  be->ops->softcap(be, &big, 1, 1, cap);
  CHECK(fabsf(big - cap) < 1e-5f, "softcap(1e6) = %g, want the cap %g", big, cap);
  CHECK(be->ops->softcap(be, x, T, F, 0.0f) != 0 && strstr(err_last(), "cap"), "cap 0 is refused: %s",
        err_last());

  float s = (float)sqrt(64.0 * 36.0);
  for (size_t i = 0; i < n; i++)
    ref[i] = xs[i] * s;
  CHECK(be->ops->scale(be, xs, n, s) == 0, "scale");
  CHECK(test_rel_l2(xs, ref, n) == 0, "scale is exact in f32: rel L2 %g", test_rel_l2(xs, ref, n));
  free(g), free(u), free(out), free(ref), free(x), free(xs);
}

/* Reference routing of one token: chosen ids ascending and their weights, in double. */
static void route_ref(const float *l, int E, int k, int *sel, double *w) {
  double p[64], m = -INFINITY, sum = 0;
  for (int e = 0; e < E; e++)
    m = fmax(m, l[e]);
  for (int e = 0; e < E; e++)
    sum += p[e] = exp(l[e] - m);
  int chosen[64] = {0};
  double ws = 0;
  for (int j = 0; j < k; j++) {
    int b = -1;
    for (int e = 0; e < E; e++)
      if (!chosen[e] && (b < 0 || p[e] > p[b]))
        b = e;
    chosen[b] = 1;
    ws += p[b];
  }
  int j = 0;
  for (int e = 0; e < E; e++)
    if (chosen[e]) {
      sel[j] = e;
      w[j++] = p[e] / ws;
    }
}

static void test_route(struct backend *be) {
  const int T = 41, E = 8, k = 2;
  float *l = rand_floats((size_t)T * E, 3.0f);
  /* token 5: a tie between experts 6 and 2 at the top: the lower id (2) ranks first, and with
   * expert 7 strictly second-highest before them, k = 2 takes 7 and 2 */
  for (int e = 0; e < E; e++)
    l[5 * E + e] = -1.0f;
  l[5 * E + 6] = l[5 * E + 2] = 2.0f;
  l[5 * E + 7] = 3.0f;
  int32_t row_token[T * k], token_rows[T * k], start[E + 1], start_h[E + 1];
  float row_w[T * k];
  CHECK(be->ops->moe_route(be, l, T, E, k, row_token, row_w, token_rows, start, start_h) == 0, "route: %s",
        err_last());
  CHECK(start[0] == 0 && start[E] == T * k, "expert_start spans all %d rows: %d..%d", T * k, start[0], start[E]);
  CHECK(memcmp(start, start_h, sizeof start) == 0, "host copy of expert_start");
  for (int e = 0; e < E; e++) {
    CHECK(start[e] <= start[e + 1], "expert_start is monotone at %d", e);
    for (int r = start[e] + 1; r < start[e + 1]; r++)
      CHECK(row_token[r - 1] < row_token[r], "expert %d's rows are in token order", e);
  }
  for (int t = 0; t < T; t++) {
    int sel[8];
    double w[8];
    route_ref(l + (size_t)t * E, E, k, sel, w);
    for (int j = 0; j < k; j++) {
      int r = token_rows[t * k + j];
      CHECK(r >= start[sel[j]] && r < start[sel[j] + 1], "token %d's row %d is expert %d's", t, j, sel[j]);
      CHECK(row_token[r] == t, "row %d belongs to token %d (got %d)", r, t, row_token[r]);
      CHECK(fabs(row_w[r] - w[j]) < 1e-6, "token %d weight %d: %g vs %g", t, j, row_w[r], w[j]);
    }
  }
  CHECK(row_token[token_rows[5 * k]] == 5 && token_rows[5 * k] >= start[2] && token_rows[5 * k] < start[3] &&
            token_rows[5 * k + 1] >= start[7],
        "tie: token 5 takes experts 2 and 7");
  CHECK(be->ops->moe_route(be, l, T, E, E + 1, row_token, row_w, token_rows, start, start_h) != 0 &&
            strstr(err_last(), "top 9"),
        "k > E is refused: %s", err_last());
  free(l);
}

/* The whole block against a dense loop: each token through its k experts, in double. */
static void test_moe_ffn(struct backend *be, enum dtype wt) {
  const int T = 23, E = 8, k = 2, D = 64, F = 96;
  struct weight g[8], u[8], dn[8], router;
  float *wf[3][8];
  void *wd[3][8];
  float *rf = rand_floats((size_t)E * D, 0.5f);
  CHECK(be->ops->weight_from_host(be, &router, rf, DTYPE_F32, E, D) == 0, "router");
  for (int e = 0; e < E; e++) {
    int64_t shape[3][2] = {{F, D}, {F, D}, {D, F}};
    struct weight *dst[3] = {&g[e], &u[e], &dn[e]};
    for (int m = 0; m < 3; m++) {
      size_t n = (size_t)shape[m][0] * shape[m][1];
      float *src = rand_floats(n, 0.2f);
      wd[m][e] = malloc(dtype_row_bytes(wt, shape[m][1]) * (size_t)shape[m][0]);
      if (wt == DTYPE_F32)
        memcpy(wd[m][e], src, n * 4);
      else
        quantize_row_q8_0(src, wd[m][e], (int64_t)n);
      wf[m][e] = malloc(n * 4); /* what the weight means: dequantized */
      dtype_to_f32(wf[m][e], wd[m][e], wt, (int64_t)n);
      free(src);
      CHECK(be->ops->weight_from_host(be, dst[m], wd[m][e], wt, shape[m][0], shape[m][1]) == 0, "expert: %s",
            err_last());
    }
  }
  struct moe_weights mw = {.n_experts = E, .top_k = k, .router = router, .gate = g, .up = u, .down = dn};
  struct moe_scratch s;
  if (moe_scratch_alloc(be, &s, 32, E, k, D, F) != 0) {
    CHECK(0, "scratch: %s", err_last());
    return;
  }
  float *x = rand_floats((size_t)T * D, 1.0f), *out = malloc(sizeof(float) * T * D), *ref = calloc((size_t)T * D, 4);
  CHECK(moe_ffn(be, out, x, &mw, &s, T) == 0, "moe_ffn: %s", err_last());
  int used = 0;
  for (int e = 0; e < E; e++)
    used += s.expert_start_host[e + 1] > s.expert_start_host[e];
  CHECK(used >= 6, "random routing spreads %d tokens over %d of 8 experts", T, used);
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * D;
    float l[8];
    for (int e = 0; e < E; e++) {
      double a = 0;
      for (int d = 0; d < D; d++)
        a += (double)rf[e * D + d] * xt[d];
      l[e] = (float)a;
    }
    int sel[8];
    double w[8];
    route_ref(l, E, k, sel, w);
    for (int j = 0; j < k; j++) {
      int e = sel[j];
      double h[96];
      for (int f = 0; f < F; f++) {
        double a = 0, b = 0;
        for (int d = 0; d < D; d++) {
          a += (double)wf[0][e][f * D + d] * xt[d];
          b += (double)wf[1][e][f * D + d] * xt[d];
        }
        h[f] = a / (1.0 + exp(-a)) * b;
      }
      for (int d = 0; d < D; d++) {
        double a = 0;
        for (int f = 0; f < F; f++)
          a += (double)wf[2][e][d * F + f] * h[f];
        ref[t * D + d] += (float)(w[j] * a);
      }
    }
  }
  double err = test_rel_l2(out, ref, (size_t)T * D);
  /* q8_0 experts multiply 8-bit quantized activations, as llama.cpp's CPU kernels do
   * (docs/cpu-backend.md): about 1% from the f32 reference */
  double tol = wt == DTYPE_Q8_0 ? 2e-2 : TOL;
  CHECK(err < tol, "moe_ffn (%s experts) rel L2 %g", dtype_name(wt), err);
  CHECK(moe_ffn(be, out, x, &mw, &s, 33) != 0 && strstr(err_last(), "33 tokens"), "T over the scratch: %s",
        err_last());
  /* the same block on scratch carved from one buffer (a model's workspace) */
  size_t bytes = moe_scratch_bytes(be, 32, E, k, D, F);
  void *ws = be->ops->alloc(be, bytes);
  int32_t host_start[9];
  struct moe_scratch sc;
  moe_scratch_carve(be, &sc, ws, 32, E, k, D, F, host_start);
  float *out2 = malloc(sizeof(float) * T * D);
  CHECK(moe_ffn(be, out2, x, &mw, &sc, T) == 0, "moe_ffn on carved scratch: %s", err_last());
  CHECK(memcmp(out, out2, sizeof(float) * T * D) == 0 || test_rel_l2(out2, ref, (size_t)T * D) < TOL,
        "carved scratch gives the same result");
  CHECK((char *)sc.y + sizeof(float) * 32 * k * D <= (char *)ws + bytes, "carved parts fit in %zu bytes", bytes);
  be->ops->free(be, ws);
  free(out2);
  moe_scratch_free(be, &s);
  for (int e = 0; e < E; e++)
    for (int m = 0; m < 3; m++) {
      free(wf[m][e]);
      free(wd[m][e]);
    }
  free(rf), free(x), free(out), free(ref);
}

int main(void) {
  struct backend *be = backend_cpu_create(2);
  if (!be)
    return 1;
  test_elementwise(be);
  test_route(be);
  test_moe_ffn(be, DTYPE_F32);
  test_moe_ffn(be, DTYPE_Q8_0);
  be->ops->destroy(be);
  return test_finish("test_cpu_moe_act");
}
