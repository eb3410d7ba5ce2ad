/* test_cpu_ops.c - every CPU backend op against a naive double-precision reference on random inputs.
 *
 * Tolerance: 1e-5 relative L2 for f32 results. The backend accumulates in f32 (dot products of
 * up to a few hundred terms, softmax sums over up to ~100 keys), whose rounding error is about
 * 1e-7 * sqrt(terms) relative; 1e-5 leaves a wide margin for that while any wrong index, head,
 * position, pairing or scale gives errors of order 1.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "test_util.h"
#include "util/log.h"

#define TOL 1e-5

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float *rand_floats(size_t n) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++)
    p[i] = test_randf(&rng);
  return p;
}

/* Host weight data of dtype T for the f32 values src (rows, cols); q8_0 quantized per block. */
static void *make_weight_data(const float *src, enum dtype t, int64_t rows, int64_t cols) {
  size_t bytes = dtype_row_bytes(t, cols) * (size_t)rows;
  uint8_t *p = malloc(bytes);
  for (int64_t i = 0; i < rows * cols; i++) {
    if (t == DTYPE_F32)
      memcpy(p + i * 4, &src[i], 4);
    else if (t == DTYPE_BF16 || t == DTYPE_F16) {
      uint16_t h = t == DTYPE_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
      memcpy(p + i * 2, &h, 2);
    }
  }
  if (t == DTYPE_Q8_0) {
    for (int64_t b = 0; b < rows * cols / Q8_0_BLOCK; b++) {
      const float *s = src + b * Q8_0_BLOCK;
      float amax = 0;
      for (int i = 0; i < Q8_0_BLOCK; i++)
        amax = fmaxf(amax, fabsf(s[i]));
      float d = amax / 127.0f;
      uint16_t d16 = f32_to_f16(d);
      uint8_t *blk = p + b * Q8_0_BYTES;
      memcpy(blk, &d16, 2);
      for (int i = 0; i < Q8_0_BLOCK; i++)
        blk[2 + i] = (uint8_t)(int8_t)lrintf(d > 0 ? s[i] / d : 0);
    }
  }
  return p;
}

static int test_matmul(struct backend *be) {
  const enum dtype types[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_Q8_0};
  const int Ts[] = {1, 3, 17, 64};
  for (int ti = 0; ti < 4; ti++) {
    enum dtype dt = types[ti];
    /* N = 37 leaves partial row tiles; K = 600 spans three column chunks with a ragged tail
     * (not a multiple of 8) except for q8_0, which needs whole blocks of 32. */
    const int N = 37, K = dt == DTYPE_Q8_0 ? 576 : 600;
    float *wf = rand_floats((size_t)N * K);
    float *bias = rand_floats(N);
    void *wdata = make_weight_data(wf, dt, N, K);
    float *wref = malloc(sizeof(float) * N * K); /* what the weight means: dequantized */
    dtype_to_f32(wref, wdata, dt, (int64_t)N * K);
    struct weight w, bw;
    REQUIRE(be->ops->weight_from_host(be, &w, wdata, dt, N, K) == 0, "weight: %s", err_last());
    CHECK(w.data == wdata, "aligned %s weight is used in place", dtype_name(dt));
    REQUIRE(be->ops->weight_from_host(be, &bw, bias, DTYPE_F32, 1, N) == 0, "bias");
    for (int i = 0; i < 4; i++) {
      int T = Ts[i];
      float *x = rand_floats((size_t)T * K);
      float *out = malloc(sizeof(float) * T * N);
      float *ref = malloc(sizeof(float) * T * N);
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        REQUIRE(be->ops->matmul(be, out, x, &w, with_bias ? &bw : NULL, T, 0) == 0, "matmul");
        for (int t = 0; t < T; t++)
          for (int n = 0; n < N; n++) {
            double s = with_bias ? bias[n] : 0;
            for (int k = 0; k < K; k++)
              s += (double)wref[(size_t)n * K + k] * x[(size_t)t * K + k];
            ref[t * N + n] = (float)s;
          }
        double e = test_rel_l2(out, ref, (size_t)T * N);
        /* q8_0 multiplies 8-bit activations, as llama.cpp does (test_cpu_quant.c says why 1e-2
         * bounds that rounding); the float types are exact up to f32 sums. */
        double tol = dt == DTYPE_Q8_0 ? 1e-2 : TOL;
        CHECK(e < tol, "matmul %s T=%d bias=%d: rel L2 %g", dtype_name(dt), T, with_bias, e);
      }
      /* Row by row (T = 1, the decode path) gives bit-for-bit the rows of the batched call: a
       * token's result must not depend on the batch it runs in. */
      float row[64];
      for (int t = 0; t < T; t++) {
        be->ops->matmul(be, row, x + (size_t)t * K, &w, &bw, 1, 0);
        if (memcmp(row, out + (size_t)t * N, sizeof(float) * N) != 0) {
          CHECK(0, "matmul %s: token %d alone differs from inside T=%d", dtype_name(dt), t, T);
          break;
        }
      }
      free(x);
      free(out);
      free(ref);
    }
    /* A misaligned host pointer is copied (typed reads of it would be undefined) and still right. */
    if (dt != DTYPE_Q8_0) {
      size_t bytes = dtype_row_bytes(dt, K) * N;
      uint8_t *odd = malloc(bytes + 1);
      memcpy(odd + 1, wdata, bytes);
      struct weight w2;
      REQUIRE(be->ops->weight_from_host(be, &w2, odd + 1, dt, N, K) == 0, "odd weight");
      CHECK(w2.data != odd + 1, "misaligned %s weight is copied", dtype_name(dt));
      float *x = rand_floats(K), *o1 = malloc(sizeof(float) * N), *o2 = malloc(sizeof(float) * N);
      be->ops->matmul(be, o1, x, &w, NULL, 1, 0);
      be->ops->matmul(be, o2, x, &w2, NULL, 1, 0);
      CHECK(memcmp(o1, o2, sizeof(float) * N) == 0, "copied weight gives the same result");
      be->ops->weight_free(be, &w2);
      free(odd);
      free(x);
      free(o1);
      free(o2);
    }
    be->ops->weight_free(be, &w);
    be->ops->weight_free(be, &bw);
    free(wf);
    free(bias);
    free(wdata);
    free(wref);
  }
  return 0;
}

static int test_rmsnorm(struct backend *be) {
  const int T = 5, D = 72;
  const float eps = 1e-5f;
  float *x = rand_floats(T * D), *res = rand_floats(T * D), *wv = rand_floats(D);
  float *res0 = malloc(sizeof(float) * T * D), *out = malloc(sizeof(float) * T * D);
  float *ref = malloc(sizeof(float) * T * D), *refres = malloc(sizeof(float) * T * D);
  memcpy(res0, res, sizeof(float) * T * D);
  struct weight w;
  REQUIRE(be->ops->weight_from_host(be, &w, wv, DTYPE_F32, 1, D) == 0, "w");
  for (int fused = 0; fused < 2; fused++) {
    memcpy(res, res0, sizeof(float) * T * D);
    REQUIRE(be->ops->rmsnorm(be, out, fused ? res : NULL, x, &w, T, D, eps) == 0, "rmsnorm");
    for (int t = 0; t < T; t++) {
      double v[256], ss = 0;
      for (int i = 0; i < D; i++) {
        v[i] = fused ? (double)res0[t * D + i] + x[t * D + i] : x[t * D + i];
        refres[t * D + i] = (float)v[i];
        ss += v[i] * v[i];
      }
      double inv = 1.0 / sqrt(ss / D + eps);
      for (int i = 0; i < D; i++)
        ref[t * D + i] = (float)(v[i] * inv * wv[i]);
    }
    double e = test_rel_l2(out, ref, T * D);
    CHECK(e < TOL, "rmsnorm fused=%d: rel L2 %g", fused, e);
    if (fused) {
      e = test_rel_l2(res, refres, T * D);
      CHECK(e < TOL, "rmsnorm residual sum: rel L2 %g", e);
    } else {
      CHECK(memcmp(res, res0, sizeof(float) * T * D) == 0, "residual untouched when not passed");
    }
  }
  /* bf16 norm weights (HF bf16 checkpoints) */
  uint16_t wb[256];
  float wbf[256];
  for (int i = 0; i < D; i++) {
    wb[i] = f32_to_bf16(wv[i]);
    wbf[i] = bf16_to_f32(wb[i]);
  }
  struct weight w16;
  REQUIRE(be->ops->weight_from_host(be, &w16, wb, DTYPE_BF16, 1, D) == 0, "w16");
  be->ops->rmsnorm(be, out, NULL, x, &w16, T, D, eps);
  for (int t = 0; t < T; t++) {
    double ss = 0;
    for (int i = 0; i < D; i++)
      ss += (double)x[t * D + i] * x[t * D + i];
    for (int i = 0; i < D; i++)
      ref[t * D + i] = (float)(x[t * D + i] / sqrt(ss / D + eps) * wbf[i]);
  }
  CHECK(test_rel_l2(out, ref, T * D) < TOL, "rmsnorm bf16 weight");
  free(x), free(res), free(wv), free(res0), free(out), free(ref), free(refres);
  return 0;
}

/* GGML: the angles of a plain theta^(-2i/d) inv_freq as llama.cpp takes them (position times
 * inv_freq[1]^i, multiplied step by step in f32); otherwise position * inv_freq[i] in f32 (HF). */
static void rope_ref(float *v, int pos, const float *inv_freq, int rot, int neox, int ggml) {
  int half = rot / 2;
  double tmp[512];
  for (int i = 0; i < rot; i++)
    tmp[i] = v[i];
  float theta = (float)pos;
  for (int i = 0; i < half; i++, theta *= inv_freq[1]) {
    double ang = ggml ? (double)theta : (double)((float)pos * inv_freq[i]);
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    v[a] = (float)(tmp[a] * cos(ang) - tmp[b] * sin(ang));
    v[b] = (float)(tmp[a] * sin(ang) + tmp[b] * cos(ang));
  }
}

static int test_rope(struct backend *be) {
  const int T = 6, H = 4, KVH = 2, HD = 32;
  int32_t pos[6] = {0, 1, 7, 100, 513, 4095};
  float inv_freq[16];
  /* scaled = 0: plain theta^(-2i/d), taken as llama.cpp does; 1: the low frequencies divided
   * by 8 (as llama3 scaling does), taken as HF does. */
  for (int scaled = 0; scaled < 2; scaled++)
  for (int neox = 0; neox < 2; neox++) {
    for (int i = 0; i < HD / 2; i++)
      inv_freq[i] = (float)(pow(10000.0, -2.0 * i / HD) / (scaled && i >= HD / 4 ? 8.0 : 1.0));
    float *q = rand_floats(T * H * HD), *k = rand_floats(T * KVH * HD);
    float *qr = malloc(sizeof(float) * T * H * HD), *kr = malloc(sizeof(float) * T * KVH * HD);
    memcpy(qr, q, sizeof(float) * T * H * HD);
    memcpy(kr, k, sizeof(float) * T * KVH * HD);
    struct rope_params rp = {.inv_freq = inv_freq, .rot_dim = HD, .neox = neox};
    REQUIRE(be->ops->rope(be, q, k, pos, T, H, KVH, HD, &rp) == 0, "rope");
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < H; h++)
        rope_ref(qr + (t * H + h) * HD, pos[t], inv_freq, HD, neox, !scaled);
      for (int h = 0; h < KVH; h++)
        rope_ref(kr + (t * KVH + h) * HD, pos[t], inv_freq, HD, neox, !scaled);
    }
    double eq = test_rel_l2(q, qr, T * H * HD), ek = test_rel_l2(k, kr, T * KVH * HD);
    CHECK(eq < TOL && ek < TOL, "rope scaled=%d neox=%d: q %g k %g", scaled, neox, eq, ek);
    free(q), free(k), free(qr), free(kr);
  }
  return 0;
}

/* LongRoPE with partial rotation: 3 sequences in one batch, the first at most long_after
 * tokens long (short table), the others longer (long table, including the prompt tokens of
 * the third whose positions are below long_after). Each token must equal the plain reference
 * with its sequence's table, cos/sin scaled by mscale on the rotated dims, and the dims past
 * rot_dim must pass unchanged. */
static int test_rope_longrope(struct backend *be) {
  enum { T = 23, H = 4, KVH = 2, HD = 32, ROT = 24 };
  const float mscale = 1.19f;
  int32_t qs[4] = {0, 9, 10, 23}, lens[3] = {9, 40, 13}, pos[T];
  for (int t = 0; t < 9; t++)
    pos[t] = t;
  pos[9] = 39;
  for (int t = 10; t < 23; t++)
    pos[t] = t - 10;
  float inv[2 * (ROT / 2)];
  for (int i = 0; i < ROT / 2; i++) {
    float base = (float)pow(10000.0, (double)(2 * i) / ROT);
    inv[i] = 1.0f / ((1.0f + 0.1f * i) * base);            /* short */
    inv[ROT / 2 + i] = 1.0f / ((1.0f + 2.0f * i) * base);  /* long */
  }
  float *q = rand_floats(T * H * HD), *k = rand_floats(T * KVH * HD);
  float *qr = malloc(sizeof(float) * T * H * HD), *kr = malloc(sizeof(float) * T * KVH * HD);
  memcpy(qr, q, sizeof(float) * T * H * HD);
  memcpy(kr, k, sizeof(float) * T * KVH * HD);
  struct rope_params rp = {.inv_freq = inv, .rot_dim = ROT, .neox = 1, .inv_freq_long = inv + ROT / 2,
                           .long_after = 12, .query_start = qs, .seq_lens = lens, .num_seqs = 3,
                           .mscale = mscale};
  REQUIRE(be->ops->rope(be, q, k, pos, T, H, KVH, HD, &rp) == 0, "longrope");
  int bad = 0;
  for (int t = 0; t < T; t++) {
    const float *tab = t < 9 ? inv : inv + ROT / 2;
    for (int h = 0; h < H + KVH; h++) {
      float *v = h < H ? qr + (t * H + h) * HD : kr + (t * KVH + h - H) * HD;
      const float *got = h < H ? q + (t * H + h) * HD : k + (t * KVH + h - H) * HD;
      float pass[HD];
      memcpy(pass, v, sizeof pass);
      for (int i = 0; i < ROT; i++)
        v[i] *= mscale; /* rotation is linear: scaling before = cos, sin scaled */
      rope_ref(v, pos[t], tab, ROT, 1, 0);
      for (int i = 0; i < HD; i++) {
        double want = i < ROT ? v[i] : pass[i];
        bad += fabs(got[i] - want) > 1e-5 * (1 + fabs(want));
      }
    }
  }
  CHECK(bad == 0, "longrope: %d values differ from the reference with the sequence's table", bad);
  free(q), free(k), free(qr), free(kr);
  return 0;
}

static int test_small_ops(struct backend *be) {
  /* silu_mul, in place on gate as the forward pass uses it */
  const int T = 3, F = 50;
  float *g = rand_floats(T * F), *u = rand_floats(T * F), *ref = malloc(sizeof(float) * T * F);
  for (int i = 0; i < T * F; i++)
    ref[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
  REQUIRE(be->ops->silu_mul(be, g, g, u, T, F) == 0, "silu_mul");
  CHECK(test_rel_l2(g, ref, T * F) < TOL, "silu_mul: %g", test_rel_l2(g, ref, T * F));
  free(g), free(u), free(ref);

  /* embed from each weight dtype: rows of the dequantized table */
  const int V = 10, D = 64;
  int32_t ids[4] = {3, 0, 9, 3};
  float *tab = rand_floats(V * D);
  const enum dtype types[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_Q8_0};
  for (int ti = 0; ti < 4; ti++) {
    void *data = make_weight_data(tab, types[ti], V, D);
    float *deq = malloc(sizeof(float) * V * D), out[4 * 64], want[4 * 64];
    dtype_to_f32(deq, data, types[ti], V * D);
    struct weight w;
    REQUIRE(be->ops->weight_from_host(be, &w, data, types[ti], V, D) == 0, "embed w");
    REQUIRE(be->ops->embed(be, out, &w, ids, 4) == 0, "embed");
    for (int t = 0; t < 4; t++)
      memcpy(want + t * D, deq + ids[t] * D, sizeof(float) * D);
    CHECK(memcmp(out, want, sizeof out) == 0, "embed %s", dtype_name(types[ti]));
    int32_t bad[2] = {1, V};
    CHECK(be->ops->embed(be, out, &w, bad, 2) != 0 && strstr(err_last(), "out of range"),
          "embed rejects id %d: %s", V, err_last());
    free(data);
    free(deq);
  }

  /* gather_rows */
  float *x = rand_floats(7 * 5), gathered[3 * 5];
  int32_t idx[3] = {6, 0, 6};
  REQUIRE(be->ops->gather_rows(be, gathered, x, idx, 3, 5) == 0, "gather");
  CHECK(!memcmp(gathered, x + 30, 20) && !memcmp(gathered + 5, x, 20) && !memcmp(gathered + 10, x + 30, 20),
        "gather_rows");
  free(x);
  free(tab);
  return 0;
}

/* Writes (pos, nkv, hd) rows of a sequence's K and V into the cache through its block table,
 * with its own index arithmetic (independent of kv_write). */
static void cache_put(float *kc, float *vc, const float *k, const float *v, const int32_t *table, int bs,
                      int nkv, int hd, int p) {
  for (int h = 0; h < nkv; h++) {
    size_t off = (((size_t)table[p / bs] * nkv + h) * bs + p % bs) * hd;
    memcpy(kc + off, k + ((size_t)p * nkv + h) * hd, sizeof(float) * hd);
    memcpy(vc + off, v + ((size_t)p * nkv + h) * hd, sizeof(float) * hd);
  }
}

#define MAXS 4
struct att_case {
  int n_seqs;
  int cached[MAXS]; /* tokens already in the cache */
  int query[MAXS];  /* new tokens this step */
  int id[MAXS];     /* which sequence's data (K, V, Q depend on (seed, id, position) only) */
};

/* Fills the K, V (KVH*HD each) and Q (H*HD) rows of sequence ID at position P. */
static void seq_rows(uint64_t seed, int id, int p, float *k, float *v, float *q, int kvdim, int qdim) {
  uint64_t r = seed * 1000003u + (uint64_t)id * 65537u + (uint64_t)p + 1;
  for (int i = 0; i < 3; i++)
    test_rand(&r);
  for (int i = 0; i < kvdim; i++) {
    k[i] = test_randf(&r);
    v[i] = test_randf(&r);
  }
  for (int i = 0; i < qdim; i++) {
    float x = test_randf(&r);
    if (q)
      q[i] = x;
  }
}

/* The sliding window and softcap run_attention passes (struct attn_params); with a window, the
 * blocks wholly before every query's window are unmapped (table entry 0, the null block, which
 * holds NaN), so a kernel that reads them fails the check. */
static int att_window;
static float att_softcap;

/* Runs one batch of CASE; returns the attention output (T, H, hd) in *out (malloc'd), and checks it
 * against the dense reference. Data comes from seed so that calls with other block sizes see the
 * same K/V/Q. */
static int run_attention(struct backend *be, const struct att_case *c, int bs, int H, int KVH, int HD,
                         uint64_t seed, float **out_p, int *T_p) {
  uint64_t r = seed ^ (uint64_t)bs * 0x5851f42d4c957f2dull; /* cache garbage and block ids */
  int T = 0, maxlen = 0;
  for (int s = 0; s < c->n_seqs; s++) {
    T += c->query[s];
    maxlen = c->cached[s] + c->query[s] > maxlen ? c->cached[s] + c->query[s] : maxlen;
  }
  int max_blocks = (maxlen + bs - 1) / bs;
  int num_blocks = 1 + c->n_seqs * max_blocks + 3; /* block 0 is the null block */
  size_t blk = (size_t)KVH * bs * HD;
  float *kc = be->ops->alloc(be, sizeof(float) * num_blocks * blk);
  float *vc = be->ops->alloc(be, sizeof(float) * num_blocks * blk);
  for (size_t i = 0; i < num_blocks * blk; i++) /* unused slots hold garbage that must not leak in */
    kc[i] = vc[i] = i < blk && att_window ? NAN : 1e3f * test_randf(&r);
  /* shuffled physical ids 1..num_blocks-1 handed out to the sequences */
  int32_t *perm = malloc(sizeof(int32_t) * num_blocks);
  for (int i = 0; i < num_blocks - 1; i++)
    perm[i] = i + 1;
  for (int i = num_blocks - 2; i > 0; i--) {
    int j = (int)(test_rand(&r) % (uint64_t)(i + 1));
    int32_t tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  int32_t *tables = calloc((size_t)c->n_seqs * max_blocks, sizeof(int32_t));
  for (int s = 0, used = 0; s < c->n_seqs; s++)
    for (int i = 0; i < (c->cached[s] + c->query[s] + bs - 1) / bs; i++)
      tables[s * max_blocks + i] = perm[used++];
  int32_t *pos = malloc(sizeof(int32_t) * T), *slots = malloc(sizeof(int32_t) * T);
  int32_t qstart[MAXS + 1], lens[MAXS];
  float *q = malloc(sizeof(float) * T * H * HD), *knew = malloc(sizeof(float) * T * KVH * HD);
  float *vnew = malloc(sizeof(float) * T * KVH * HD), *out = malloc(sizeof(float) * T * H * HD);
  float *ref = malloc(sizeof(float) * T * H * HD);
  float *seqk[MAXS], *seqv[MAXS];
  qstart[0] = 0;
  for (int s = 0; s < c->n_seqs; s++) {
    int len = c->cached[s] + c->query[s];
    lens[s] = len;
    qstart[s + 1] = qstart[s] + c->query[s];
    seqk[s] = malloc(sizeof(float) * len * KVH * HD);
    seqv[s] = malloc(sizeof(float) * len * KVH * HD);
    for (int p = 0; p < len; p++) {
      int t = qstart[s] + p - c->cached[s];
      seq_rows(seed, c->id[s], p, seqk[s] + (size_t)p * KVH * HD, seqv[s] + (size_t)p * KVH * HD,
               p >= c->cached[s] ? q + (size_t)t * H * HD : NULL, KVH * HD, H * HD);
    }
    for (int p = 0; p < c->cached[s]; p++)
      cache_put(kc, vc, seqk[s], seqv[s], tables + s * max_blocks, bs, KVH, HD, p);
    for (int i = 0; i < c->query[s]; i++) {
      int t = qstart[s] + i, p = c->cached[s] + i;
      pos[t] = p;
      slots[t] = tables[s * max_blocks + p / bs] * bs + p % bs;
      memcpy(knew + (size_t)t * KVH * HD, seqk[s] + (size_t)p * KVH * HD, sizeof(float) * KVH * HD);
      memcpy(vnew + (size_t)t * KVH * HD, seqv[s] + (size_t)p * KVH * HD, sizeof(float) * KVH * HD);
    }
  }
  for (int s = 0; s < c->n_seqs && att_window; s++) /* blocks no query of s can see */
    for (int i = 0; (i + 1) * bs <= c->cached[s] - att_window + 1; i++)
      tables[s * max_blocks + i] = 0;
  struct kv_layer kv = {kc, vc, 1.0f, 1.0f, DTYPE_F32, num_blocks, bs, KVH, HD};
  struct batch b = {0};
  b.num_tokens = T;
  b.num_seqs = c->n_seqs;
  b.max_blocks_per_seq = max_blocks;
  b.max_seq_len = maxlen;
  b.positions = pos;
  b.slot_mapping = slots;
  b.query_start = qstart;
  b.seq_lens = lens;
  b.block_tables = tables;
  float scale = 1.0f / sqrtf((float)HD);
  int rc = be->ops->kv_write(be, &kv, knew, vnew, &b);
  CHECK(rc == 0, "kv_write: %s", err_last());
  struct attn_params ap = {.n_heads = H, .scale = scale, .softcap = att_softcap, .window = att_window};
  rc = rc ? rc : be->ops->attention(be, out, q, &kv, &b, &ap);
  CHECK(rc == 0, "attention: %s", err_last());
  /* dense reference: softmax over positions j0..p of the sequence (j0 = p - window + 1 with a
   * window, else 0), scores softcapped as transformers' Gemma 2 does, in double */
  for (int s = 0; s < c->n_seqs; s++)
    for (int t = qstart[s]; t < qstart[s + 1]; t++)
      for (int h = 0; h < H; h++) {
        int kvh = h / (H / KVH), p = pos[t], j0 = att_window && p - att_window + 1 > 0 ? p - att_window + 1 : 0;
        double *w = malloc(sizeof(double) * (p + 1)), mx = -INFINITY, sum = 0;
        const float *qv = q + ((size_t)t * H + h) * HD;
        for (int j = j0; j <= p; j++) {
          double d = 0;
          for (int i = 0; i < HD; i++)
            d += (double)qv[i] * seqk[s][((size_t)j * KVH + kvh) * HD + i];
          w[j] = att_softcap > 0 ? att_softcap * tanh(d * scale / att_softcap) : d * scale;
          mx = fmax(mx, w[j]);
        }
        for (int j = j0; j <= p; j++)
          sum += (w[j] = exp(w[j] - mx));
        for (int i = 0; i < HD; i++) {
          double a = 0;
          for (int j = j0; j <= p; j++)
            a += w[j] * seqv[s][((size_t)j * KVH + kvh) * HD + i];
          ref[((size_t)t * H + h) * HD + i] = (float)(a / sum);
        }
        free(w);
      }
  double e = test_rel_l2(out, ref, (size_t)T * H * HD);
  CHECK(rc == 0 && e < TOL, "attention bs=%d H=%d KVH=%d HD=%d seqs=%d window=%d softcap=%g: rel L2 %g", bs,
        H, KVH, HD, c->n_seqs, att_window, (double)att_softcap, e);
  for (int s = 0; s < c->n_seqs; s++)
    free(seqk[s]), free(seqv[s]);
  be->ops->free(be, kc);
  be->ops->free(be, vc);
  free(perm), free(tables), free(pos), free(slots), free(q), free(knew), free(vnew), free(ref);
  *out_p = out;
  *T_p = T;
  return 0;
}

static int test_attention_variant(struct backend *be);

/* Paged attention against the dense reference, and bitwise invariances (block size, batch
 * neighbours, decode vs prefill chunk), without and with a sliding window and softcapping
 * (windows that cut inside a chunk of ATT_CHUNK keys, one wider than every context). */
static int test_attention(struct backend *be) {
  const struct {
    int window;
    float softcap;
  } variants[4] = {{0, 0}, {13, 0}, {0, 2.5f}, {40, 1.5f}};
  for (int vi = 0; vi < 4; vi++) {
    att_window = variants[vi].window;
    att_softcap = variants[vi].softcap;
    if (test_attention_variant(be))
      return 1;
  }
  att_softcap = 0;
  att_window = 100; /* wider than every context: bitwise the same as no window */
  float *a, *w;
  int T;
  const struct att_case one = {2, {37, 50}, {11, 1}, {1, 2}};
  if (run_attention(be, &one, 16, 4, 2, 64, 77, &w, &T))
    return 1;
  att_window = 0;
  if (run_attention(be, &one, 16, 4, 2, 64, 77, &a, &T))
    return 1;
  CHECK(memcmp(a, w, sizeof(float) * T * 4 * 64) == 0, "a window wider than the context changes the output");
  free(a), free(w);
  return 0;
}

static int test_attention_variant(struct backend *be) {
  /* mixed: a prefill from scratch, a chunk over a cached prefix, two decodes */
  const struct att_case mixed = {4, {0, 37, 50, 5}, {20, 11, 1, 1}, {0, 1, 2, 3}};
  const int ratios[3] = {1, 2, 4};
  const int hds[2] = {64, 20}; /* 20: not a multiple of the SIMD width */
  for (int hi = 0; hi < 2; hi++)
    for (int ri = 0; ri < 3; ri++) {
      int KVH = 2, H = KVH * ratios[ri], HD = hds[hi];
      float *by_bs[3];
      int T = 0;
      const int bss[3] = {8, 16, 32};
      for (int bi = 0; bi < 3; bi++)
        if (run_attention(be, &mixed, bss[bi], H, KVH, HD, 1234 + hi * 10 + ri, &by_bs[bi], &T))
          return 1;
      /* same tokens, other block sizes: bitwise equal by construction (keys are visited in
       * position order in fixed chunks), so any difference is a paging bug */
      for (int bi = 1; bi < 3; bi++)
        CHECK(memcmp(by_bs[0], by_bs[bi], sizeof(float) * T * H * HD) == 0,
              "attention differs between block size 8 and %d (H=%d KVH=%d HD=%d): rel L2 %g", bss[bi], H,
              KVH, HD, test_rel_l2(by_bs[bi], by_bs[0], (size_t)T * H * HD));
      /* Each sequence alone (other physical blocks, no neighbours) gives bitwise the same rows as
       * inside the mixed batch; and each token of the prefill chunks, computed alone as a decode
       * step over its cached prefix, gives the same row as inside its chunk. */
      const size_t rowf = (size_t)H * HD;
      int row = 0;
      for (int s = 0; s < mixed.n_seqs; s++) {
        struct att_case alone = {1, {mixed.cached[s]}, {mixed.query[s]}, {mixed.id[s]}};
        float *o1;
        int T1;
        if (run_attention(be, &alone, 16, H, KVH, HD, 1234 + hi * 10 + ri, &o1, &T1))
          return 1;
        CHECK(memcmp(o1, by_bs[0] + row * rowf, sizeof(float) * rowf * T1) == 0,
              "sequence %d alone differs from the mixed batch", s);
        free(o1);
        for (int i = 0; i < mixed.query[s]; i += 7) {
          struct att_case dec = {1, {mixed.cached[s] + i}, {1}, {mixed.id[s]}};
          if (run_attention(be, &dec, 8, H, KVH, HD, 1234 + hi * 10 + ri, &o1, &T1))
            return 1;
          CHECK(memcmp(o1, by_bs[0] + (row + i) * rowf, sizeof(float) * rowf) == 0,
                "token %d of sequence %d: decode alone differs from its prefill chunk", i, s);
          free(o1);
        }
        row += mixed.query[s];
      }
      for (int bi = 0; bi < 3; bi++)
        free(by_bs[bi]);
    }
  return 0;
}

/* kv_write skips slot -1 and refuses slots beyond the pool; copy_blocks copies whole blocks in
 * every layer and refuses ids outside the pool. */
static int test_kv_misc(struct backend *be) {
  const int NB = 5, BS = 8, KVH = 2, HD = 16;
  size_t blk = (size_t)KVH * BS * HD, total = NB * blk;
  struct kv_layer layers[2];
  float *before[2];
  for (int l = 0; l < 2; l++) {
    layers[l] = (struct kv_layer){be->ops->alloc(be, total * 4), be->ops->alloc(be, total * 4), 1.0f, 1.0f,
                                  DTYPE_F32, NB, BS, KVH, HD};
    for (size_t i = 0; i < total; i++) {
      ((float *)layers[l].k)[i] = test_randf(&rng);
      ((float *)layers[l].v)[i] = test_randf(&rng);
    }
    before[l] = malloc(total * 8);
    memcpy(before[l], layers[l].k, total * 4);
    memcpy(before[l] + total, layers[l].v, total * 4);
  }
  float *k = rand_floats(3 * KVH * HD), *v = rand_floats(3 * KVH * HD);
  int32_t slots[3] = {-1, 3 * BS + 5, -1};
  struct batch b = {0};
  b.num_tokens = 3;
  b.slot_mapping = slots;
  REQUIRE(be->ops->kv_write(be, &layers[0], k, v, &b) == 0, "kv_write");
  float *kc = layers[0].k, *vc = layers[0].v;
  for (size_t i = 0; i < total; i++) {
    size_t bl = i / blk, h = (i % blk) / ((size_t)BS * HD), off = (i % ((size_t)BS * HD)) / HD, d = i % HD;
    int written = bl == 3 && off == 5;
    float wk = written ? k[(KVH + h) * HD + d] : before[0][i];
    float wv = written ? v[(KVH + h) * HD + d] : before[0][total + i];
    if (kc[i] != wk || vc[i] != wv) {
      CHECK(0, "kv_write: element %zu (block %zu head %zu offset %zu) wrong", i, bl, h, off);
      break;
    }
  }
  slots[0] = NB * BS;
  CHECK(be->ops->kv_write(be, &layers[0], k, v, &b) != 0, "kv_write refuses a slot beyond the pool");
  for (int l = 0; l < 2; l++) {
    memcpy(before[l], layers[l].k, total * 4);
    memcpy(before[l] + total, layers[l].v, total * 4);
  }
  int32_t src[2] = {1, 4}, dst[2] = {2, 0};
  REQUIRE(be->ops->copy_blocks(be, layers, 2, src, dst, 2) == 0, "copy_blocks");
  for (int l = 0; l < 2; l++) {
    float *lk = layers[l].k, *lv = layers[l].v;
    CHECK(!memcmp(lk + 2 * blk, before[l] + 1 * blk, blk * 4) && !memcmp(lk, before[l] + 4 * blk, blk * 4),
          "copy_blocks K layer %d", l);
    CHECK(!memcmp(lv + 2 * blk, before[l] + total + 1 * blk, blk * 4) &&
              !memcmp(lv, before[l] + total + 4 * blk, blk * 4), "copy_blocks V layer %d", l);
    CHECK(!memcmp(lk + blk, before[l] + blk, blk * 4) && !memcmp(lk + 3 * blk, before[l] + 3 * blk, 2 * blk * 4),
          "copy_blocks leaves other blocks");
  }
  dst[1] = NB;
  CHECK(be->ops->copy_blocks(be, layers, 2, src, dst, 2) != 0, "copy_blocks refuses block %d", NB);
  /* the CPU keeps K/V in f32, f16 or f8e4m3 */
  layers[0].dtype = DTYPE_BF16;
  CHECK(be->ops->kv_write(be, &layers[0], k, v, &b) != 0 && strstr(err_last(), "bf16"),
        "bf16 KV refused with a message: %s", err_last());
  for (int l = 0; l < 2; l++) {
    be->ops->free(be, layers[l].k);
    be->ops->free(be, layers[l].v);
    free(before[l]);
  }
  free(k), free(v);
  return 0;
}

static float r16(float x) { return f16_to_f32(f32_to_f16(x)); }

/* F16 cache: kv_write stores f32_to_f16 of K/V; attention follows llama.cpp's non-flash CPU
 * attention (q, k, v and the normalized probabilities rounded to f16, sums in f32/double),
 * checked against a dense double reference with those roundings, for a prefill and a decode step;
 * the order is per sequence (query length 1 or more), independent of the rest of the batch;
 * copy_blocks copies f16 blocks. HD 64 takes both orders' SIMD bodies, HD 20 their tails. */
static int test_attention_f16(struct backend *be, int HD) {
  const int N = 41, H = 4, KVH = 2, BS = 8, NB = 1 + (N + BS - 1) / BS + 1;
  const size_t blk = (size_t)KVH * BS * HD;
  uint16_t *kc = be->ops->alloc(be, 2 * NB * blk), *vc = be->ops->alloc(be, 2 * NB * blk);
  REQUIRE(kc && vc, "alloc");
  memset(kc, 0, 2 * NB * blk);
  memset(vc, 0, 2 * NB * blk);
  float *k = rand_floats((size_t)N * KVH * HD), *v = rand_floats((size_t)N * KVH * HD);
  float *q = rand_floats((size_t)N * H * HD), *out = malloc(sizeof(float) * N * H * HD);
  for (int i = 0; i < N * H * HD; i++)
    q[i] *= 3; /* peaked softmax: probabilities spread over several binades */
  int32_t table[8], pos[64], slots[64], qstart[2] = {0, N}, lens[1] = {N};
  for (int i = 0; i < (N + BS - 1) / BS; i++)
    table[i] = NB - 1 - i; /* reversed physical order */
  for (int t = 0; t < N; t++) {
    pos[t] = t;
    slots[t] = table[t / BS] * BS + t % BS;
  }
  struct kv_layer kv = {kc, vc, 1.0f, 1.0f, DTYPE_F16, NB, BS, KVH, HD};
  struct batch b = {0};
  b.num_tokens = N;
  b.num_seqs = 1;
  b.max_blocks_per_seq = 8;
  b.max_seq_len = N;
  b.positions = pos;
  b.slot_mapping = slots;
  b.query_start = qstart;
  b.seq_lens = lens;
  b.block_tables = table;
  const float scale = 1.0f / sqrtf((float)HD);
  REQUIRE(be->ops->kv_write(be, &kv, k, v, &b) == 0, "kv_write f16: %s", err_last());
  int bad = 0;
  for (int t = 0; t < N; t++)
    for (int h = 0; h < KVH; h++)
      for (int i = 0; i < HD; i++) {
        size_t c = (((size_t)table[t / BS] * KVH + h) * BS + t % BS) * HD + i, x = ((size_t)t * KVH + h) * HD + i;
        bad += kc[c] != f32_to_f16(k[x]) || vc[c] != f32_to_f16(v[x]);
      }
  CHECK(!bad, "kv_write f16: %d elements differ from f32_to_f16", bad);
  struct attn_params ap = {.n_heads = H, .scale = scale};
  REQUIRE(be->ops->attention(be, out, q, &kv, &b, &ap) == 0, "attention f16: %s", err_last());
  float *ref = malloc(sizeof(float) * N * H * HD), *exact = malloc(sizeof(float) * N * H * HD);
  double w[64], we[64];
  for (int t = 0; t < N; t++)
    for (int h = 0; h < H; h++) {
      int kvh = h / (H / KVH);
      double mx = -INFINITY, mxe = -INFINITY, sum = 0, sume = 0;
      for (int j = 0; j <= t; j++) {
        double d = 0, de = 0;
        for (int i = 0; i < HD; i++) {
          float qi = q[((size_t)t * H + h) * HD + i], ki = k[((size_t)j * KVH + kvh) * HD + i];
          d += (double)r16(qi) * r16(ki);
          de += (double)qi * ki;
        }
        w[j] = d * scale, we[j] = de * scale;
        mx = fmax(mx, w[j]), mxe = fmax(mxe, we[j]);
      }
      for (int j = 0; j <= t; j++)
        sum += (w[j] = exp(w[j] - mx)), sume += (we[j] = exp(we[j] - mxe));
      for (int i = 0; i < HD; i++) {
        double a = 0, ae = 0;
        for (int j = 0; j <= t; j++) {
          float vi = v[((size_t)j * KVH + kvh) * HD + i];
          a += (double)r16((float)(w[j] / sum)) * r16(vi);
          ae += we[j] / sume * vi;
        }
        ref[((size_t)t * H + h) * HD + i] = (float)a;
        exact[((size_t)t * H + h) * HD + i] = (float)ae;
      }
    }
  double e = test_rel_l2(out, ref, (size_t)N * H * HD), e_exact = test_rel_l2(out, exact, (size_t)N * H * HD);
  /* an f16 probability may round the other way where ggml's vector exp and the double reference
   * straddle a rounding boundary (one f16 ulp on that weight): 1e-5, 30x below the f16 effect */
  CHECK(e < 1e-5, "attention f16 HD=%d vs the f16-rounded reference: rel L2 %g (exact: %g)", HD, e, e_exact);
  /* the roundings are really there: f32 math would sit much closer to the exact result */
  CHECK(e_exact > 3e-5 && e_exact < 1e-2, "attention f16 vs exact: rel L2 %g", e_exact);
  /* The last token alone as a decode step over the cache: llama.cpp's one-token order, within
   * the same tolerance of the reference (bits may differ from its prefill row, as in llama.cpp). */
  float *one = malloc(sizeof(float) * H * HD), *two = malloc(sizeof(float) * 3 * H * HD);
  b.num_tokens = 1;
  b.positions = pos + N - 1;
  b.slot_mapping = slots + N - 1;
  qstart[1] = 1;
  REQUIRE(be->ops->attention(be, one, q + (size_t)(N - 1) * H * HD, &kv, &b, &ap) == 0, "decode f16");
  e = test_rel_l2(one, ref + (size_t)(N - 1) * H * HD, (size_t)H * HD);
  CHECK(e < 1e-5, "attention f16 decode vs the f16-rounded reference: rel L2 %g", e);
  /* The order is chosen per sequence by its query length: a batch of that decode (sequence 0) and
   * a chunk of the last two tokens (sequence 1, same cache) gives the decode's bits for sequence 0
   * and the full prefill's bits for the chunk (a prompt split into chunks of 2+ tokens). */
  int32_t pos2[3] = {N - 1, N - 2, N - 1}, qs2[3] = {0, 1, 3}, lens2[2] = {N, N}, tables2[16];
  for (int i = 0; i < 8; i++)
    tables2[i] = tables2[8 + i] = table[i];
  float *q2 = malloc(sizeof(float) * 3 * H * HD);
  memcpy(q2, q + (size_t)(N - 1) * H * HD, sizeof(float) * H * HD);
  memcpy(q2 + (size_t)H * HD, q + (size_t)(N - 2) * H * HD, sizeof(float) * 2 * H * HD);
  struct batch b2 = b;
  b2.num_tokens = 3;
  b2.num_seqs = 2;
  b2.positions = pos2;
  b2.query_start = qs2;
  b2.seq_lens = lens2;
  b2.block_tables = tables2;
  REQUIRE(be->ops->attention(be, two, q2, &kv, &b2, &ap) == 0, "f16 mixed batch: %s", err_last());
  CHECK(!memcmp(two, one, sizeof(float) * H * HD), "f16: a decode's bits do not depend on its batch");
  CHECK(!memcmp(two + (size_t)H * HD, out + (size_t)(N - 2) * H * HD, sizeof(float) * 2 * H * HD),
        "f16: a 2-token chunk gives the prefill's bits");
  free(q2), free(two);
  /* copy_blocks: whole f16 blocks */
  int32_t src[1] = {table[0]}, dst[1] = {0};
  REQUIRE(be->ops->copy_blocks(be, &kv, 1, src, dst, 1) == 0, "copy_blocks f16: %s", err_last());
  CHECK(!memcmp(kc, kc + (size_t)table[0] * blk, 2 * blk) && !memcmp(vc, vc + (size_t)table[0] * blk, 2 * blk),
        "copy_blocks f16");
  be->ops->free(be, kc);
  be->ops->free(be, vc);
  free(k), free(v), free(q), free(out), free(ref), free(exact), free(one);
  return 0;
}

/* FP8 E4M3 conversions: every finite code round-trips; halfway points between neighbours round
 * to the even code; values at or past 448 (infinities included) saturate; NaN stays NaN;
 * decoding matches the format's definition (bias 7, subnormals m * 2^-9). */
static void test_f8e4m3(void) {
  int bad = 0;
  for (int c = 0; c < 256; c++) {
    float f = f8e4m3_to_f32((uint8_t)c);
    int e = (c >> 3) & 15, m = c & 7;
    if ((c & 0x7f) == 0x7f) {
      bad += !isnan(f) || (f32_to_f8e4m3(f) & 0x7f) != 0x7f;
      continue;
    }
    double want = (e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9)) * (c & 0x80 ? -1 : 1);
    bad += f != (float)want || f32_to_f8e4m3(f) != c;
    if ((c & 0x7f) < 0x7e) { /* halfway to the next code away from zero */
      float mid = (float)((f8e4m3_to_f32((uint8_t)c) + (double)f8e4m3_to_f32((uint8_t)(c + 1))) / 2);
      uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
      bad += f32_to_f8e4m3(mid) != even;
      bad += f32_to_f8e4m3(nextafterf(mid, 0.0f)) != c || f32_to_f8e4m3(nextafterf(mid, c & 0x80 ? -1e9f : 1e9f)) != c + 1;
    }
  }
  CHECK(!bad, "f8e4m3: %d codes round-trip or round wrongly", bad);
  CHECK(f32_to_f8e4m3(448.0f) == 0x7e && f32_to_f8e4m3(1e6f) == 0x7e && f32_to_f8e4m3(-INFINITY) == 0xfe,
        "f8e4m3 saturates to +-448");
  CHECK(f32_to_f8e4m3(1e-9f) == 0 && f32_to_f8e4m3(-1e-9f) == 0x80, "f8e4m3 underflows to signed zero");
  CHECK(f8e4m3_to_f32(0x38) == 1.0f && f8e4m3_to_f32(0x01) == 0.001953125f && f8e4m3_to_f32(0xfe) == -448.0f,
        "f8e4m3 decodes 1, the smallest subnormal and -448");
}

/* F8E4M3 cache with per-layer scales (0.5 for K, 2 for V): kv_write stores e4m3(x / scale);
 * attention gives bit for bit the F32 cache's result over the dequantized values (the CPU
 * reference the CUDA kernels are checked against), stays close to the exact f32 result, and
 * decode equals the prefill row; copy_blocks copies 1-byte blocks. */
static int test_attention_f8(struct backend *be) {
  const int N = 45, H = 8, KVH = 2, HD = 32, BS = 16, NB = 1 + (N + BS - 1) / BS + 1;
  const size_t blk = (size_t)KVH * BS * HD;
  uint8_t *kc = be->ops->alloc(be, NB * blk), *vc = be->ops->alloc(be, NB * blk);
  float *kf = be->ops->alloc(be, 4 * NB * blk), *vf = be->ops->alloc(be, 4 * NB * blk);
  REQUIRE(kc && vc && kf && vf, "alloc");
  memset(kc, 0, NB * blk);
  memset(vc, 0, NB * blk);
  memset(kf, 0, 4 * NB * blk);
  memset(vf, 0, 4 * NB * blk);
  float *k = rand_floats((size_t)N * KVH * HD), *v = rand_floats((size_t)N * KVH * HD);
  float *kd = malloc(sizeof(float) * N * KVH * HD), *vd = malloc(sizeof(float) * N * KVH * HD);
  float *q = rand_floats((size_t)N * H * HD), *out = malloc(sizeof(float) * N * H * HD);
  float *ref = malloc(sizeof(float) * N * H * HD), *exact = malloc(sizeof(float) * N * H * HD);
  for (int i = 0; i < N * H * HD; i++)
    q[i] *= 3;
  int32_t table[8], pos[64], slots[64], qstart[2] = {0, N}, lens[1] = {N};
  for (int i = 0; i < (N + BS - 1) / BS; i++)
    table[i] = NB - 1 - i;
  for (int t = 0; t < N; t++) {
    pos[t] = t;
    slots[t] = table[t / BS] * BS + t % BS;
  }
  struct kv_layer kv = {kc, vc, 0.5f, 2.0f, DTYPE_F8E4M3, NB, BS, KVH, HD};
  struct kv_layer kvf = {kf, vf, 1.0f, 1.0f, DTYPE_F32, NB, BS, KVH, HD};
  struct batch b = {0};
  b.num_tokens = N;
  b.num_seqs = 1;
  b.max_blocks_per_seq = 8;
  b.max_seq_len = N;
  b.positions = pos;
  b.slot_mapping = slots;
  b.query_start = qstart;
  b.seq_lens = lens;
  b.block_tables = table;
  REQUIRE(be->ops->kv_write(be, &kv, k, v, &b) == 0, "kv_write f8: %s", err_last());
  int bad = 0;
  for (int t = 0; t < N; t++)
    for (int h = 0; h < KVH; h++)
      for (int i = 0; i < HD; i++) {
        size_t c = (((size_t)table[t / BS] * KVH + h) * BS + t % BS) * HD + i, x = ((size_t)t * KVH + h) * HD + i;
        bad += kc[c] != f32_to_f8e4m3(k[x] / 0.5f) || vc[c] != f32_to_f8e4m3(v[x] / 2.0f);
        kd[x] = f8e4m3_to_f32(kc[c]) * 0.5f;
        vd[x] = f8e4m3_to_f32(vc[c]) * 2.0f;
      }
  CHECK(!bad, "kv_write f8: %d elements differ from f32_to_f8e4m3(x / scale)", bad);
  REQUIRE(be->ops->kv_write(be, &kvf, kd, vd, &b) == 0, "kv_write f32: %s", err_last());
  struct attn_params ap = {.n_heads = H, .scale = 1.0f / sqrtf((float)HD)};
  REQUIRE(be->ops->attention(be, out, q, &kv, &b, &ap) == 0, "attention f8: %s", err_last());
  REQUIRE(be->ops->attention(be, ref, q, &kvf, &b, &ap) == 0, "attention f32: %s", err_last());
  CHECK(!memcmp(out, ref, sizeof(float) * N * H * HD), "attention f8 == f32 over the dequantized cache");
  struct kv_layer kve = kvf;
  REQUIRE(be->ops->kv_write(be, &kve, k, v, &b) == 0 && be->ops->attention(be, exact, q, &kve, &b, &ap) == 0,
          "attention f32 exact: %s", err_last());
  double e = test_rel_l2(out, exact, (size_t)N * H * HD);
  CHECK(e > 1e-4 && e < 0.08, "attention f8 vs f32 K/V: rel L2 %g (e4m3 keeps 3 mantissa bits)", e);
  float *one = malloc(sizeof(float) * H * HD);
  b.num_tokens = 1;
  b.positions = pos + N - 1;
  b.slot_mapping = slots + N - 1;
  qstart[1] = 1;
  REQUIRE(be->ops->attention(be, one, q + (size_t)(N - 1) * H * HD, &kv, &b, &ap) == 0, "decode f8");
  CHECK(!memcmp(one, out + (size_t)(N - 1) * H * HD, sizeof(float) * H * HD), "f8 decode row == prefill row");
  int32_t src[1] = {table[0]}, dst[1] = {0};
  REQUIRE(be->ops->copy_blocks(be, &kv, 1, src, dst, 1) == 0, "copy_blocks f8: %s", err_last());
  CHECK(!memcmp(kc, kc + (size_t)table[0] * blk, blk) && !memcmp(vc, vc + (size_t)table[0] * blk, blk),
        "copy_blocks f8");
  be->ops->free(be, kc), be->ops->free(be, vc), be->ops->free(be, kf), be->ops->free(be, vf);
  free(k), free(v), free(kd), free(vd), free(q), free(out), free(ref), free(exact), free(one);
  return 0;
}

/* Threads follow the op's size: stories260K-sized ops (dim 64, vocab 512, 8 sequences) run on
 * one thread, large ones on all of them, never more than the backend's count. */
static void test_threads_for(struct backend *be) {
  CHECK(cpu_threads_for(be, 64 * 64 * 8) == 1, "q projection of a tiny model: 1 thread");
  CHECK(cpu_threads_for(be, 512 * 64 * 8) == 1, "lm head of a tiny model, 8 tokens: 1 thread");
  CHECK(cpu_threads_for(be, 0) == 1, "empty op: 1 thread");
  CHECK(cpu_threads_for(be, (int64_t)4096 * 4096 * 8) == be->num_threads, "large matmul: all threads");
  CHECK(cpu_threads_for(be, (int64_t)3 * CPU_WORK_PER_THREAD / 2) == 1, "1.5 units of work: 1 thread");
}

int main(void) {
  struct backend *be = backend_cpu_create(2);
  REQUIRE(be != NULL, "backend: %s", err_last());
  test_threads_for(be);
  CHECK(strcmp(be->ops->name, "cpu") == 0 && be->act_dtype == DTYPE_F32, "cpu backend, f32 activations");
  CHECK(be->ops->mem_available(be) > ((size_t)1 << 20), "MemAvailable read from /proc/meminfo");
  test_matmul(be);
  test_rmsnorm(be);
  test_rope(be);
  test_rope_longrope(be);
  test_small_ops(be);
  test_attention(be);
  test_kv_misc(be);
  test_attention_f16(be, 20);
  test_attention_f16(be, 64);
  test_f8e4m3();
  test_attention_f8(be);
  be->ops->destroy(be);
  return test_finish("test_cpu_ops");
}
