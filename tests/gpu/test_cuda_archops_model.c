/* test_cuda_archops_model.c - Gemma 2 and Mixtral on the CUDA backend against transformers'
 * fixtures (tests/fixtures/{gemma2,mixtral} and their .gguf conversions): logits of the 40-token
 * prompt in one step (rel L2 < 4e-2, the bf16 tolerance of test_cuda_model.c), the same tokens
 * one per step through the paged cache (block size 8, so Gemma 2's window of 8 drops whole
 * blocks), and the greedy continuation of greedy.json (28 tokens, positions 12..39) decoded one
 * token per step, compared token by token with transformers' (reported, and required to agree
 * wherever the top-2 margin exceeds what bf16 can move: 0.1 in logit).
 *
 * Mixtral: a token whose k-th and (k+1)-th router logits are closer than bf16 rounding moves them
 * may be sent to another expert, which changes its output entirely (and, through attention, the
 * later positions a little). This fixture has such near-ties (router_gaps.json: gap 0.008 at
 * position 12 of layer 0, 0.017 at 17 of layer 1), and the H200 run flips them (rel L2 0.94 at
 * position 12). So for MoE models the logits are required within TOL_MODEL at the positions
 * before the first gap < GAP_BF16 and only reported after it; the greedy prompt (12 tokens)
 * lies before it. Measured on an H200: positions 0..9 rel L2 1.1e-2; all 40: 1.8e-1. */
#include <cjson/cJSON.h>
#include <math.h>

#include "gpu_pair.h"
#include "model/model.h"

#define TOL_MODEL 4e-2
#define MARGIN 0.1f
/* Router logit gaps below this may flip under bf16 activations (their logits move by ~1e-2). */
#define GAP_BF16 0.05
#define MAXB 16
#define BS 8

static int read_ids(const cJSON *arr, int32_t *out, int cap) {
  int n = cJSON_GetArraySize(arr);
  if (!cJSON_IsArray(arr) || n > cap)
    return -1;
  for (int i = 0; i < n; i++)
    out[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
  return n;
}

static int step(struct model *m, const int32_t *tokens, int t0, int T, float *logits) {
  int32_t table[MAXB], pos[128], slots[128], lidx[128], qs[2] = {0, T}, len = t0 + T;
  for (int i = 0; i < MAXB; i++)
    table[i] = MAXB - i;
  for (int i = 0; i < T; i++) {
    pos[i] = t0 + i;
    slots[i] = table[(t0 + i) / BS] * BS + (t0 + i) % BS;
    lidx[i] = i;
  }
  struct batch b = {T, 1, MAXB, len, T, tokens + t0, pos, slots, qs, &len, table, T, lidx};
  return model_forward(m, &b, logits);
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i;
  return best;
}

/* transformers' margin between its top two logits at row R of REF (V wide). */
static float margin(const float *ref, int V) {
  float a = -1e30f, b = -1e30f;
  for (int i = 0; i < V; i++) {
    if (ref[i] > a) {
      b = a;
      a = ref[i];
    } else if (ref[i] > b) {
      b = ref[i];
    }
  }
  return a - b;
}

/* The first position whose router gap (tests/fixtures/NAME/router_gaps.json, made by
 * tools/make_fixtures.py: k-th minus (k+1)-th largest router logit of transformers' routing) is
 * below GAP_BF16 in any layer; N when none. From there on a bf16 backend may route differently. */
static int first_near_tie(const char *path, int n) {
  char p[700];
  snprintf(p, sizeof p, "%s", path);
  size_t l = strlen(p);
  if (l > 5 && !strcmp(p + l - 5, ".gguf"))
    p[l - 5] = 0; /* NAME.gguf: the gaps are in NAME/ */
  strncat(p, "/router_gaps.json", sizeof p - strlen(p) - 1);
  size_t len;
  char *t = test_read_file(p, &len);
  cJSON *j = t ? cJSON_Parse(t) : NULL, *gaps = j ? cJSON_GetObjectItem(j, "gaps") : NULL;
  int first = cJSON_IsArray(gaps) ? n : -1;
  for (int layer = 0; first >= 0 && layer < cJSON_GetArraySize(gaps); layer++) {
    const cJSON *row = cJSON_GetArrayItem(gaps, layer);
    for (int i = 0; i < n && i < cJSON_GetArraySize(row); i++)
      if (cJSON_GetArrayItem(row, i)->valuedouble < GAP_BF16 && i < first)
        first = i;
  }
  CHECK(first >= 0, "%s: cannot read router gaps", p);
  cJSON_Delete(j);
  free(t);
  return first;
}

static void check_model(const char *path, const int32_t *toks, int n, const float *want, const int32_t *prompt,
                        int np, const int32_t *gr, int ng) {
  struct backend *be = pair_be[1];
  struct model *m = model_load(path, be);
  if (!m) {
    CHECK(0, "%s: model_load: %s", path, err_last_where());
    return;
  }
  int V = model_get_config(m)->vocab_size;
  float *got = malloc(sizeof(float) * (size_t)n * V);
  if (model_alloc_cache(m, MAXB + 1, BS, DTYPE_BF16, 128, 1, MAXB) != 0) {
    CHECK(0, "%s: %s", path, err_last_where());
    goto out;
  }
  CHECK(step(m, toks, 0, n, got) == 0, "%s: forward: %s", path, err_last_where());
  double e = test_rel_l2(got, want, (size_t)n * V);
  int moe = model_get_config(m)->n_experts > 0, off = 0;
  printf("  %s: one step of %d tokens: rel L2 vs transformers %.3g; positions over %.0e:", path, n, e,
         TOL_MODEL);
  for (int t = 0; t < n; t++) {
    double et = test_rel_l2(got + (size_t)t * V, want + (size_t)t * V, (size_t)V);
    if (et >= TOL_MODEL) {
      off++;
      printf(" %d (%.3g)", t, et);
    }
  }
  printf("\n");
  if (moe) { /* every position before the first routing near-tie must hold (see the header) */
    int p = first_near_tie(path, n);
    double ep = p > 0 ? test_rel_l2(got, want, (size_t)p * V) : 0;
    CHECK(p > 0 && ep < TOL_MODEL, "%s: positions 0..%d (before the first router gap < %.2f): rel L2 %.3g", path,
          p - 1, GAP_BF16, ep);
    printf("  %s: positions 0..%d, before the first router gap < %.2f: rel L2 %.3g\n", path, p - 1, GAP_BF16, ep);
  } else
    CHECK(e < TOL_MODEL, "%s: prompt step rel L2 vs transformers %.3g >= %.3g", path, e, TOL_MODEL);
  /* one token per step */
  for (int t = 0; t < n; t++)
    if (step(m, toks, t, 1, got + (size_t)t * V) != 0) {
      CHECK(0, "%s: decode: %s", path, err_last_where());
      goto out;
    }
  double e1 = e;
  e = test_rel_l2(got, want, (size_t)n * V);
  if (moe) /* the same routing whatever the batch: the same error as the prompt step */
    CHECK(fabs(e - e1) < 0.1 * e1 + 1e-3, "%s: token-by-token rel L2 %.3g, prompt step %.3g", path, e, e1);
  else
    CHECK(e < TOL_MODEL, "%s: token-by-token rel L2 vs transformers %.3g >= %.3g", path, e, TOL_MODEL);
  printf("  %s: %d single-token steps: rel L2 vs transformers %.3g\n", path, n, e);
  /* greedy, teacher-forced on transformers' tokens so one flip does not derail the rest */
  int32_t seq[128];
  memcpy(seq, prompt, sizeof(int32_t) * (size_t)np);
  memcpy(seq + np, gr, sizeof(int32_t) * (size_t)ng);
  int same = 0, must = 0, len = np;
  if (step(m, seq, 0, np, got) != 0) {
    CHECK(0, "%s: prefill: %s", path, err_last_where());
    goto out;
  }
  const float *last = got + (size_t)(np - 1) * V;
  float *row = malloc(sizeof(float) * V);
  for (int i = 0; i < ng; i++) {
    memcpy(row, last, sizeof(float) * V);
    int tok = argmax(row, V);
    same += tok == gr[i];
    /* the reference logits of this position exist for the fixture's own prompt only when the
     * continuation is that prompt; use the CUDA logits' own margin as the bound instead */
    float mg = margin(row, V);
    if (mg > MARGIN) {
      must++;
      CHECK(tok == gr[i], "%s: greedy token %d (position %d) is %d, transformers %d (margin %.3f)", path, i,
            len, tok, gr[i], mg);
    }
    if (i + 1 == ng || step(m, seq, len, 1, got) != 0)
      break;
    len++;
    last = got;
  }
  free(row);
  printf("  %s: greedy %d/%d tokens equal to transformers' (%d with a margin > %.1f must be)\n", path, same, ng,
         must, MARGIN);
out:
  free(got);
  model_free(m);
}

static void check_fixture(const char *name) {
  char dir[512], gguf[600], p[600];
  snprintf(dir, sizeof dir, "%s", test_fixture_path(name));
  snprintf(gguf, sizeof gguf, "%s.gguf", dir);
  size_t len = 0, llen = 0;
  snprintf(p, sizeof p, "%s/tokens.json", dir);
  char *tj = test_read_file(p, &len);
  snprintf(p, sizeof p, "%s/greedy.json", dir);
  char *gj = test_read_file(p, &len);
  snprintf(p, sizeof p, "%s/logits.bin", dir);
  float *want = (float *)test_read_file(p, &llen);
  cJSON *tokens = tj ? cJSON_Parse(tj) : NULL, *greedy = gj ? cJSON_Parse(gj) : NULL;
  int32_t toks[128], prompt[64], gr[64];
  int n = tokens ? read_ids(tokens, toks, 128) : -1;
  int np = greedy ? read_ids(cJSON_GetObjectItem(cJSON_GetArrayItem(greedy, 0), "prompt"), prompt, 64) : -1;
  int ng = greedy ? read_ids(cJSON_GetObjectItem(cJSON_GetArrayItem(greedy, 0), "output"), gr, 64) : -1;
  CHECK(n > 0 && np > 0 && ng > 0 && want && llen == (size_t)n * 256 * sizeof(float), "%s: fixture files", name);
  if (n > 0 && np > 0 && ng > 0 && want && llen == (size_t)n * 256 * sizeof(float)) {
    check_model(dir, toks, n, want, prompt, np, gr, ng);
    check_model(gguf, toks, n, want, prompt, np, gr, ng);
  }
  cJSON_Delete(tokens);
  cJSON_Delete(greedy);
  free(tj), free(gj), free(want);
}

int main(void) {
  if (!pair_open())
    return test_skip("no CUDA device");
  pair_seed();
  check_fixture("gemma2");
  check_fixture("mixtral");
  pair_close();
  return test_finish("test_cuda_archops_model");
}
