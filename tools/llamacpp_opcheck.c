/* llamacpp_opcheck.c - feeds the tensors llama.cpp computed (tools/llamacpp_dump.c) to pagoda's
 * CPU ops one op at a time and says, for each, how many outputs differ from llama.cpp's and by
 * how much: the op-by-op comparison behind docs/cpu-backend.md, "Fidelity to llama.cpp".
 * Llama-architecture GGUF files (interleaved rope, f16 KV cache).
 *
 *   cc -O2 -std=gnu11 -o llamacpp_opcheck tools/llamacpp_opcheck.c -Isrc -Iinclude \
 *      build/libpagoda.a -lutf8proc -lcurl -lcrypto -fopenmp -lm
 *   llamacpp_opcheck MODEL.gguf DUMPDIR
 *
 * Layers 0 and 1: rmsnorm, the q/k/v/o and gate/up/down matmuls, rope, silu_mul and (when the
 * dump holds the whole prompt) attention over a cache filled with llama.cpp's own k and v;
 * every layer: the down projection; then the output head. Exit status 0 when all are equal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/gguf.h"
#include "util/log.h"

static const char *dir;
static struct backend *be;
static struct gguf_file *g;
static int n_differ;

static float *load(const char *name, int k, size_t *n) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s.%d.bin", dir, name, k);
  FILE *f = fopen(p, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  float *b = malloc((size_t)sz);
  if (!b || fread(b, 1, (size_t)sz, f) != (size_t)sz) {
    fprintf(stderr, "error: cannot read %s\n", p);
    exit(1);
  }
  fclose(f);
  if (n)
    *n = (size_t)sz / sizeof(float);
  return b;
}

static void compare(const char *what, const float *got, const float *want, size_t n) {
  size_t diff = 0;
  double md = 0, se = 0, sw = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    diff += got[i] != want[i];
    md = d > md ? d : md;
    se += d * d, sw += (double)want[i] * want[i];
  }
  n_differ += diff > 0;
  printf("%-26s %7zu of %-7zu differ, max abs %.3g, rel L2 %.3g\n", what, diff, n, md, sqrt(se / (sw + 1e-30)));
}

static struct weight weight(const char *name) {
  const struct gguf_tensor *t = gguf_find_tensor(g, name);
  struct weight w;
  if (!t || t->dtype < 0 ||
      be->ops->weight_from_host(be, &w, t->data, t->dtype, t->num_dims > 1 ? t->ne[1] : 1, t->ne[0])) {
    fprintf(stderr, "error: weight %s: %s\n", name, t ? err_last() : "not in the file");
    exit(1);
  }
  return w;
}

static void matmul(const char *wname, const char *in, const char *out) {
  size_t n;
  float *x = load(in, 0, &n), *want = load(out, 0, NULL);
  if (!x || !want)
    return;
  struct weight w = weight(wname);
  int T = (int)(n / w.cols);
  float *got = malloc(sizeof(float) * (size_t)T * w.rows);
  be->ops->matmul(be, got, x, &w, NULL, T, 1);
  char label[128];
  snprintf(label, sizeof label, "matmul %s", out);
  compare(label, got, want, (size_t)T * w.rows);
  free(x), free(want), free(got);
}

static void rmsnorm(const char *wname, const char *in, const char *out, float eps) {
  size_t n;
  float *x = load(in, 0, &n), *want = load(out, 0, NULL);
  if (!x || !want)
    return;
  struct weight w = weight(wname);
  float *got = malloc(sizeof(float) * n);
  be->ops->rmsnorm(be, got, NULL, x, &w, (int)(n / w.cols), (int)w.cols, eps);
  char label[128];
  snprintf(label, sizeof label, "rmsnorm %s", out);
  compare(label, got, want, n);
  free(x), free(want), free(got);
}

static int64_t meta_int(const char *key) {
  int64_t v;
  if (gguf_get_int(g, key, &v)) {
    fprintf(stderr, "error: %s not in the file\n", key);
    exit(1);
  }
  return v;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: llamacpp_opcheck MODEL.gguf DUMPDIR\n");
    return 2;
  }
  dir = argv[2];
  be = backend_cpu_create(1);
  if (!(g = gguf_open(argv[1]))) {
    fprintf(stderr, "error: %s\n", err_last());
    return 1;
  }
  const int dim = (int)meta_int("llama.embedding_length"), nh = (int)meta_int("llama.attention.head_count");
  const int nkv = (int)meta_int("llama.attention.head_count_kv"), nl = (int)meta_int("llama.block_count");
  const int hd = dim / nh;
  double base = 10000, eps = 1e-5;
  gguf_get_float(g, "llama.rope.freq_base", &base);
  gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps);
  char p[1024];
  snprintf(p, sizeof p, "%s/tokens.txt", dir);
  FILE *tf = fopen(p, "r");
  int n_prompt = 0, tok;
  while (tf && fscanf(tf, "%d", &tok) == 1)
    n_prompt++;
  if (tf)
    fclose(tf);
  for (int L = 0; L < 2 && L < nl; L++) {
    char w[8][64], a[64], b[64], c[64];
    static const char *const wn[8] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                      "attn_norm", "ffn_norm"};
    for (int i = 0; i < 8; i++)
      snprintf(w[i], sizeof w[i], "blk.%d.%s.weight", L, wn[i]);
    if (L > 0) {
      snprintf(a, sizeof a, "l_out-%d", L - 1), snprintf(b, sizeof b, "attn_norm-%d", L);
      rmsnorm(w[6], a, b, (float)eps);
    }
    snprintf(a, sizeof a, "attn_norm-%d", L);
    snprintf(b, sizeof b, "Qcur-%d", L), matmul(w[0], a, b);
    snprintf(b, sizeof b, "Kcur-%d", L), matmul(w[1], a, b);
    snprintf(b, sizeof b, "Vcur-%d", L), matmul(w[2], a, b);
    size_t nq, nk;
    snprintf(b, sizeof b, "Qcur-%d", L), snprintf(c, sizeof c, "Kcur-%d", L);
    float *q = load(b, 0, &nq), *qr = load(b, 2, NULL), *k = load(c, 0, &nk), *kr = load(c, 2, NULL);
    int T = q ? (int)(nq / dim) : 0;
    if (q && qr && k && kr) { /* rope at the dump's positions */
      int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
      float *inv = malloc(sizeof(float) * (size_t)(hd / 2));
      for (int i = 0; i < T; i++)
        pos[i] = n_prompt - T + i;
      for (int i = 0; i < hd / 2; i++) /* as model.c computes inv_freq */
        inv[i] = (float)(1.0 / pow(base, (double)((float)(2 * i) / (float)hd)));
      struct rope_params rp = {inv, hd, 0};
      be->ops->rope(be, q, k, pos, T, nh, nkv, hd, &rp);
      compare("rope q", q, qr, nq);
      compare("rope k", k, kr, nk);
      snprintf(a, sizeof a, "Vcur-%d", L);
      float *v = load(a, 1, NULL);
      if (v && T == n_prompt) { /* the whole prompt: attention over llama.cpp's own k and v */
        int bs = 16, nb = (T + bs - 1) / bs;
        struct kv_layer kv = {0};
        kv.dtype = DTYPE_F16, kv.num_blocks = nb, kv.block_size = bs, kv.n_kv_heads = nkv, kv.head_dim = hd;
        kv.k = calloc((size_t)nb * nkv * bs * hd, 2), kv.v = calloc((size_t)nb * nkv * bs * hd, 2);
        int32_t *table = malloc(sizeof(int32_t) * (size_t)nb), qs[2] = {0, T}, len = T, last = T - 1;
        for (int i = 0; i < nb; i++)
          table[i] = i;
        struct batch bt = {T, 1, nb, T, T, NULL, pos, pos, qs, &len, table, 1, &last};
        float *got = malloc(sizeof(float) * nq);
        snprintf(a, sizeof a, "kqv_out-%d", L);
        float *want = load(a, 0, NULL);
        struct attn_params ap = {nh, 1.0f / sqrtf((float)hd), 0.0f, 0};
        if (want && be->ops->kv_write(be, &kv, kr, v, &bt) == 0 && be->ops->attention(be, got, qr, &kv, &bt, &ap) == 0)
          compare("attention", got, want, nq);
        free(got), free(want), free(table), free(kv.k), free(kv.v);
      }
      free(v), free(pos), free(inv);
    }
    free(q), free(qr), free(k), free(kr);
    snprintf(a, sizeof a, "kqv_out-%d", L), snprintf(b, sizeof b, "attn_out-%d", L), matmul(w[3], a, b);
    snprintf(a, sizeof a, "ffn_inp-%d", L), snprintf(b, sizeof b, "ffn_norm-%d", L), rmsnorm(w[7], a, b, (float)eps);
    snprintf(a, sizeof a, "ffn_norm-%d", L);
    snprintf(b, sizeof b, "ffn_gate-%d", L), matmul(w[4], a, b);
    snprintf(b, sizeof b, "ffn_up-%d", L), matmul(w[5], a, b);
    size_t n;
    snprintf(a, sizeof a, "ffn_gate-%d", L), snprintf(b, sizeof b, "ffn_up-%d", L);
    snprintf(c, sizeof c, "ffn_swiglu-%d", L);
    float *gt = load(a, 0, &n), *up = load(b, 0, NULL), *want = load(c, 0, NULL);
    if (gt && up && want) {
      float *got = malloc(sizeof(float) * n);
      be->ops->silu_mul(be, got, gt, up, 1, (int)n);
      compare("silu_mul", got, want, n);
      free(got);
    }
    free(gt), free(up), free(want);
  }
  for (int L = 0; L < nl; L++) {
    char w[64], a[64], b[64];
    snprintf(w, sizeof w, "blk.%d.ffn_down.weight", L);
    snprintf(a, sizeof a, "ffn_swiglu-%d", L), snprintf(b, sizeof b, "ffn_out-%d", L);
    matmul(w, a, b);
  }
  matmul(gguf_find_tensor(g, "output.weight") ? "output.weight" : "token_embd.weight", "result_norm",
         "result_output");
  printf("%s\n", n_differ ? "some ops differ" : "all equal");
  return n_differ != 0;
}
