/* cpu_attention.c - paged causal attention over the block tables (GQA), online softmax.
 *
 * F32 and F8E4M3 caches: each (query token, head) is computed on its own: it walks the keys of
 * its sequence in position order 0..pos through the block table, in chunks of ATT_CHUNK positions. The chunks are fixed
 * in position space, and no other token takes part, so a token's result
 * is bit-for-bit the same whatever the block size, the other sequences in the batch, or whether
 * it is computed inside a prefill chunk or alone in a decode step. A sliding window (struct
 * attn_params) starts the walk at the first key inside it; the chunks stay where they are, so a
 * window wider than the context gives the same bits as no window.
 *
 * An F16 cache computes as llama.cpp's CPU attention without flash attention does (its default
 * KV type): K and V rounded to f16 when written, Q rounded to f16 for the scores, ggml's softmax,
 * and the normalized probabilities rounded to f16 before they weight V. llama.cpp sums K.q and
 * P.V in one of two orders, chosen by how many tokens its step holds; here the rule is per
 * SEQUENCE, by that sequence's query length in the step: more than one token (a prompt or prefill
 * chunk) takes tinyBLAS's order (16 lanes), exactly one (a decode step) ggml_vec_dot_f16's (64
 * lanes). So on this path a token's bits depend on its own sequence's query length (a prompt
 * token prefilled differs by an ulp from the same token decoded alone, as in llama.cpp), but
 * still not on the other sequences of the batch, the block size, or how a prompt is split into
 * chunks of two or more tokens. Greedy text then follows llama.cpp's through near ties.
 */
#include <math.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATT_SIMD 1
#else
#define ATT_SIMD 0
#endif

#include "backend/cpu/cpu_backend.h"
#include "util/dtype.h"
#include "util/log.h"

#define ATT_CHUNK 32 /* key positions scored before one softmax rescale */
#define ATT_GROUP 8  /* query heads of one KV head processed together at most */

static inline float att_dot(const float *a, const float *b, int n) {
  int i = 0;
  float s = 0;
#if ATT_SIMD
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  s = _mm_cvtss_f32(h);
#endif
  for (; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* acc[i] = acc[i] * c + e * v[i] */
static inline void att_axpby(float *acc, float c, float e, const float *v, int n) {
  int i = 0;
#if ATT_SIMD
  __m256 cv = _mm256_set1_ps(c), ev = _mm256_set1_ps(e);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + i),
                                              _mm256_mul_ps(cv, _mm256_loadu_ps(acc + i))));
#endif
  for (; i < n; i++)
    acc[i] = acc[i] * c + e * v[i];
}

/* Gemma 2's attention logit softcapping: cap * tanh(s / cap), or s when cap <= 0. */
static inline float att_cap(float s, float cap) { return cap > 0 ? cap * tanhf(s / cap) : s; }

/* The first key position a query at POS sees under window W (0: no window). */
static inline int att_first_key(int pos, int w) { return w > 0 && pos - w + 1 > 0 ? pos - w + 1 : 0; }

/* Rejects batches whose metadata would read outside the cache (request-path input). */
static int att_check(const struct kv_layer *kv, const struct batch *b, int n_heads) {
  if (kv->dtype != DTYPE_F32 && kv->dtype != DTYPE_F16 && kv->dtype != DTYPE_F8E4M3)
    return ERR("cpu backend: KV cache dtype %s is not supported (the CPU keeps K/V in f32, f16 or f8e4m3)",
               dtype_name(kv->dtype));
  if (kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads != 0)
    return ERR("attention: %d heads are not a multiple of %d KV heads", n_heads, kv->n_kv_heads);
  if (kv->head_dim > CPU_MAX_HEAD_DIM)
    return ERR("attention: head_dim %d above %d", kv->head_dim, CPU_MAX_HEAD_DIM);
  if (b->query_start[0] != 0 || b->query_start[b->num_seqs] != b->num_tokens)
    return ERR("attention: query_start must cover tokens [0, %d)", b->num_tokens);
  for (int s = 0; s < b->num_seqs; s++) {
    int len = b->seq_lens[s];
    if (b->query_start[s + 1] < b->query_start[s])
      return ERR("attention: query_start decreases at sequence %d", s);
    if (len < 0 || len > (int64_t)b->max_blocks_per_seq * kv->block_size)
      return ERR("attention: sequence %d of %d tokens exceeds its %d blocks", s, len,
                 b->max_blocks_per_seq);
    const int32_t *table = b->block_tables + (size_t)s * b->max_blocks_per_seq;
    for (int i = 0; i < (len + kv->block_size - 1) / kv->block_size; i++)
      if (table[i] < 0 || table[i] >= kv->num_blocks)
        return ERR("attention: sequence %d maps block %d to %d, outside the pool of %d", s, i,
                   table[i], kv->num_blocks);
    for (int t = b->query_start[s]; t < b->query_start[s + 1]; t++)
      if (b->positions[t] < 0 || b->positions[t] >= len)
        return ERR("attention: token %d at position %d outside its sequence of %d", t, b->positions[t],
                   len);
  }
  return 0;
}

/* Row OFF (in elements) of cache C as f32: the row itself for F32, else (F8E4M3) dequantized
 * into BUF (head_dim floats) with SCALE. */
static inline const float *att_row(const struct kv_layer *kv, const void *c, size_t off, float scale, float *buf) {
  if (kv->dtype == DTYPE_F32)
    return (const float *)c + off;
  const uint8_t *r = (const uint8_t *)c + off;
  for (int i = 0; i < kv->head_dim; i++)
    buf[i] = f8e4m3_to_f32(r[i]) * scale;
  return buf;
}

/* Heads h0 .. h0 + nh - 1 (all mapped to KV head kvh) of query token t of sequence seq. They
 * share each key and value read; every head's arithmetic is the same as when it runs alone. */
static void att_heads(float *o, const float *qs, const void *kc, const void *vc, const struct kv_layer *kv,
                      const struct batch *b, const struct attn_params *ap, int t, int seq, int kvh, int h0,
                      int nh) {
  const int hd = kv->head_dim, bs = kv->block_size, nkv = kv->n_kv_heads, n_heads = ap->n_heads;
  const float scale = ap->scale, cap = ap->softcap;
  const int32_t *table = b->block_tables + (size_t)seq * b->max_blocks_per_seq;
  const int pos = b->positions[t], first = att_first_key(pos, ap->window);
  float acc[ATT_GROUP][CPU_MAX_HEAD_DIM]; /* per head: sum of exp(score - m) * v */
  float sc[ATT_GROUP][ATT_CHUNK];
  float m[ATT_GROUP], l[ATT_GROUP];
  const float *vrow[ATT_CHUNK];
  const float *qv[ATT_GROUP];
  float kbuf[CPU_MAX_HEAD_DIM];            /* F8E4M3: the dequantized key row */
  float vbuf[ATT_CHUNK][CPU_MAX_HEAD_DIM]; /* F8E4M3: the chunk's dequantized value rows */
  for (int g = 0; g < nh; g++) {
    qv[g] = qs + ((size_t)t * n_heads + h0 + g) * hd;
    m[g] = -INFINITY;
    l[g] = 0;
    for (int i = 0; i < hd; i++)
      acc[g][i] = 0;
  }
  for (int j0 = first / ATT_CHUNK * ATT_CHUNK; j0 <= pos; j0 += ATT_CHUNK) {
    int n = pos + 1 - j0 < ATT_CHUNK ? pos + 1 - j0 : ATT_CHUNK;
    int jf = first > j0 ? first - j0 : 0; /* keys before the window are not read */
    for (int jj = jf; jj < n; jj++) {
      int j = j0 + jj;
      size_t off = (((size_t)table[j / bs] * nkv + kvh) * bs + (size_t)(j % bs)) * hd;
      const float *krow = att_row(kv, kc, off, kv->k_scale, kbuf);
      for (int g = 0; g < nh; g++)
        sc[g][jj] = att_cap(att_dot(qv[g], krow, hd) * scale, cap);
      vrow[jj] = att_row(kv, vc, off, kv->v_scale, vbuf[jj]);
    }
    for (int g = 0; g < nh; g++) {
      float cm = -INFINITY;
      for (int jj = jf; jj < n; jj++)
        cm = sc[g][jj] > cm ? sc[g][jj] : cm;
      float nm = m[g] > cm ? m[g] : cm;
      float corr = expf(m[g] - nm); /* 0 on the first chunk (m = -inf) */
      l[g] *= corr;
      for (int jj = jf; jj < n; jj++) {
        float e = expf(sc[g][jj] - nm);
        l[g] += e;
        att_axpby(acc[g], jj == jf ? corr : 1.0f, e, vrow[jj], hd);
      }
      m[g] = nm;
    }
  }
  for (int g = 0; g < nh; g++) {
    float inv = 1.0f / l[g];
    float *ov = o + ((size_t)t * n_heads + h0 + g) * hd;
    for (int i = 0; i < hd; i++)
      ov[i] = acc[g][i] * inv;
  }
}

/* Exact conversions (F16C when the build has it; the values are the same either way). */
static inline void f16_row(float *dst, const uint16_t *src, int n) {
  int i = 0;
#if defined(__F16C__) && ATT_SIMD
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
  for (; i < n; i++)
    dst[i] = f16_to_f32(src[i]);
}

static inline float round_f16(float x) {
#if defined(__F16C__) && ATT_SIMD
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
  return f16_to_f32(f32_to_f16(x));
#endif
}

/* llama.cpp's two summation orders (F16 cache). A "lane" is one f32 accumulator of a SIMD
 * register: element i of a dot product, or key j of the softmax and of P.V, goes to lane
 * (i or j) mod 16 (llamafile's tinyBLAS, one 16-float register: the order for a sequence with
 * more than one query token in the step) or mod 64 (ggml_vec_dot_f16, four 16-float registers:
 * one query token). Lanes are fixed by position, so keys outside [first, pos] (llama.cpp's
 * masked and padded keys, whose probability is exactly 0) are not visited: adding 0 is exact. */
#define LL_TINY 16
#define LL_VEC 64

/* _mm512_reduce_add_ps of 16 lanes: v[i] + v[i + 8], then + 4, + 2, + 1. */
static inline float ll_halve16(const float *v) {
  float w[8];
  for (int i = 0; i < 8; i++)
    w[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; i++)
    w[i] = w[i] + w[i + 4];
  for (int i = 0; i < 2; i++)
    w[i] = w[i] + w[i + 2];
  return w[0] + w[1];
}

#if ATT_SIMD
/* ll_halve16's last three steps on the 8 sums v[i] + v[i + 8] */
static inline float ll_hsum8(__m256 w) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}
#endif

/* GGML_F16_VEC_REDUCE of four 16-lane registers s0..s3 (lanes 0..63): (s0+s2)+(s1+s3), halved. */
static inline float ll_fold64(const float *s) {
  float v[16];
  for (int k = 0; k < 16; k++)
    v[k] = (s[k] + s[32 + k]) + (s[16 + k] + s[48 + k]);
  return ll_halve16(v);
}

/* The f16-operand dot product Q16.K of length N as llama.cpp's K*Q matmul computes it: tinyBLAS
 * when TINY (and N a multiple of 16, else ggml falls back to the vector dot), else
 * ggml_vec_dot_f16 (64-lane body, the remaining N mod 64 products added in double). */
static inline float ll_dot(const float *q, const float *k, int n, int tiny) {
  if (tiny && n % LL_TINY == 0) {
#if ATT_SIMD /* one 16-lane register as two 8-lane halves: the same lanes, the same FMAs */
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < n; i += LL_TINY) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), a1);
    }
    return ll_hsum8(_mm256_add_ps(a0, a1));
#else
    float a[LL_TINY] = {0};
    for (int i = 0; i < n; i += LL_TINY)
      for (int l = 0; l < LL_TINY; l++)
        a[l] = fmaf(q[i + l], k[i + l], a[l]);
    return ll_halve16(a);
#endif
  }
  const int np = n & ~(LL_VEC - 1);
  double s;
#if ATT_SIMD
  __m256 r[8];
  for (int m = 0; m < 8; m++)
    r[m] = _mm256_setzero_ps();
  for (int i = 0; i < np; i += LL_VEC)
    for (int m = 0; m < 8; m++)
      r[m] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8 * m), _mm256_loadu_ps(k + i + 8 * m), r[m]);
  /* registers s0..s3 = r[0..1], r[2..3], r[4..5], r[6..7]: (s0+s2)+(s1+s3), then halved */
  __m256 lo = _mm256_add_ps(_mm256_add_ps(r[0], r[4]), _mm256_add_ps(r[2], r[6]));
  __m256 hi = _mm256_add_ps(_mm256_add_ps(r[1], r[5]), _mm256_add_ps(r[3], r[7]));
  s = ll_hsum8(_mm256_add_ps(lo, hi));
#else
  float a[LL_VEC] = {0};
  for (int i = 0; i < np; i += LL_VEC)
    for (int l = 0; l < LL_VEC; l++)
      a[l] = fmaf(q[i + l], k[i + l], a[l]);
  s = ll_fold64(a);
#endif
  for (int i = np; i < n; i++)
    s += (double)(q[i] * k[i]);
  return (float)s;
}

/* a[i] = fma(v[i], p, a[i]) for i < n */
static inline void ll_axpy(float *a, const float *v, float p, int n) {
  int i = 0;
#if ATT_SIMD
  __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_fmadd_ps(_mm256_loadu_ps(v + i), pv, _mm256_loadu_ps(a + i)));
#endif
  for (; i < n; i++)
    a[i] = fmaf(v[i], p, a[i]);
}

/* ggml_v_expf (ggml's AVX-512 vector exp, used by its softmax), one lane. */
static inline float ll_expf(float x) {
  const float r = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, r), n = z - r;
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                      u, fmaf(0x1.ffffecp-1f, b, 1.0f));
  if (!(fabsf(n) <= 192.0f)) /* also x = -inf (n = -inf) */
    return n > 0.0f ? INFINITY : 0.0f;
  const int e = (int)n;
  if (e < -126 || e > 127)
    return scalbnf(j, e); /* _mm512_scalef_ps: one rounding, into the subnormals too */
  union { uint32_t u; float f; } p2 = {.u = (uint32_t)(e + 127) << 23};
  return j * p2.f; /* a power of two in range: the same single rounding */
}

/* Score of key J of KV head KVH for the f16-rounded query Q16 (F16 cache), in the order TINY. */
static inline float att_score_f16(const float *q16, const uint16_t *kc, const struct kv_layer *kv,
                                  const int32_t *table, int kvh, int j, float scale, float cap, int tiny) {
  const int hd = kv->head_dim, bs = kv->block_size;
  const uint16_t *k = kc + (((size_t)table[j / bs] * kv->n_kv_heads + kvh) * bs + (size_t)(j % bs)) * hd;
  float kf[CPU_MAX_HEAD_DIM];
  f16_row(kf, k, hd);
  return att_cap(ll_dot(q16, kf, hd, tiny) * scale, cap);
}

/* Scores (then exponentials) kept on the stack when the window fits; else recomputed per pass
 * (the same values). */
#define ATT_F16_KEEP 4096

/* Head H of query token T of sequence SEQ over an F16 cache, as llama.cpp's non-flash CPU
 * attention computes it: scores in the order of the sequence's query length (TINY: more than one
 * token), their maximum, ggml's softmax (vector exp, 16-key partial sums added in double, times
 * the f32 inverse of the sum), the probabilities rounded to f16, then P.V in the same order as the
 * scores, streamed over the keys into the lanes of key j mod 16 / 64. */
static void att_head_f16(float *o, const float *qs, const uint16_t *kc, const uint16_t *vc,
                         const struct kv_layer *kv, const struct batch *b, const struct attn_params *ap,
                         int t, int seq, int kvh, int h) {
  const int hd = kv->head_dim, bs = kv->block_size, nkv = kv->n_kv_heads, n_heads = ap->n_heads;
  const float scale = ap->scale, cap = ap->softcap;
  const int32_t *table = b->block_tables + (size_t)seq * b->max_blocks_per_seq;
  const int pos = b->positions[t], first = att_first_key(pos, ap->window);
  const int tiny = b->query_start[seq + 1] - b->query_start[seq] > 1;
  const int L = tiny ? LL_TINY : LL_VEC;
  const float *q = qs + ((size_t)t * n_heads + h) * hd;
  float q16[CPU_MAX_HEAD_DIM], vf[CPU_MAX_HEAD_DIM];
  float acc[LL_VEC * CPU_MAX_HEAD_DIM]; /* lane l of output element i at [l * hd + i] */
  float kept[ATT_F16_KEEP];             /* key j at [j - first] when keep */
  const int keep = pos - first < ATT_F16_KEEP;
  for (int i = 0; i < hd; i++)
    q16[i] = round_f16(q[i]);
  for (int i = 0; i < L * hd; i++)
    acc[i] = 0;
  float m = -INFINITY;
  for (int j = first; j <= pos; j++) {
    float sc = att_score_f16(q16, kc, kv, table, kvh, j, scale, cap, tiny);
    if (keep)
      kept[j - first] = sc;
    m = sc > m ? sc : m;
  }
  double sum = 0;
  for (int j0 = first / LL_TINY * LL_TINY; j0 <= pos; j0 += LL_TINY) {
    float g[LL_TINY];
    for (int l = 0; l < LL_TINY; l++) {
      int j = j0 + l;
      if (j < first || j > pos) {
        g[l] = 0;
        continue;
      }
      g[l] = ll_expf((keep ? kept[j - first] : att_score_f16(q16, kc, kv, table, kvh, j, scale, cap, tiny)) - m);
      if (keep)
        kept[j - first] = g[l];
    }
    sum += (double)ll_halve16(g);
  }
  const float inv = (float)(1.0 / sum);
  for (int j = first; j <= pos; j++) {
    float e = keep ? kept[j - first] : ll_expf(att_score_f16(q16, kc, kv, table, kvh, j, scale, cap, tiny) - m);
    float p = round_f16(e * inv);
    const uint16_t *v = vc + (((size_t)table[j / bs] * nkv + kvh) * bs + (size_t)(j % bs)) * hd;
    f16_row(vf, v, hd);
    ll_axpy(acc + (size_t)(j % L) * hd, vf, p, hd);
  }
  float *ov = o + ((size_t)t * n_heads + h) * hd;
  for (int i = 0; i < hd; i++) {
    float lane[LL_VEC];
    for (int l = 0; l < L; l++)
      lane[l] = acc[(size_t)l * hd + i];
    ov[i] = tiny ? ll_halve16(lane) : ll_fold64(lane);
  }
}

/* The sequence s of flattened token T: query_start[s] <= t < query_start[s+1]. */
static int att_seq_of(const struct batch *b, int t) {
  int lo = 0, hi = b->num_seqs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (b->query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

int cpu_attention(struct backend *be, void *out, const void *q, const struct kv_layer *kv,
                  const struct batch *b, const struct attn_params *ap) {
  const int n_heads = ap->n_heads;
  if (att_check(kv, b, n_heads) != 0)
    return -1;
  if (ap->window < 0 || !(ap->softcap >= 0))
    return ERR("attention: window %d and softcap %g must be >= 0", ap->window, (double)ap->softcap);
  float *o = out;          /* (T, n_heads, head_dim) */
  const float *qs = q;     /* (T, n_heads, head_dim) */
  const void *kc = kv->k; /* (num_blocks, n_kv_heads, block_size, head_dim) of f32 or f8e4m3 */
  const void *vc = kv->v; /* (num_blocks, n_kv_heads, block_size, head_dim) of f32 or f8e4m3 */
  const int nkv = kv->n_kv_heads, group = n_heads / nkv, T = b->num_tokens;
  int64_t keys = 0; /* (query, key) pairs of the step: QK and PV cost 2 x head_dim each per head */
  for (int s = 0; s < b->num_seqs; s++)
    keys += (int64_t)(b->query_start[s + 1] - b->query_start[s]) *
            (ap->window > 0 && ap->window < b->seq_lens[s] ? ap->window : b->seq_lens[s]);
  const int num_thr = cpu_threads_for(be, keys * n_heads * 2 * kv->head_dim);
  if (kv->dtype == DTYPE_F16) {
    const int64_t num_items = (int64_t)T * n_heads;
#pragma omp parallel for num_threads(num_thr) if (num_items > 1) schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; item++) {
      int t = (int)(item / n_heads), h = (int)(item % n_heads);
      att_head_f16(o, qs, kv->k, kv->v, kv, b, ap, t, att_seq_of(b, t), h / group, h);
    }
    return 0;
  }
  /* Heads sharing a KV head run together (one read of K/V for the group) when that still leaves
   * enough work items for the threads; else one head per item. Results are the same either way. */
  int gsz = (int64_t)T * nkv >= 2 * (int64_t)num_thr ? group : 1;
  gsz = gsz > ATT_GROUP ? ATT_GROUP : gsz;
  const int num_sub = (group + gsz - 1) / gsz;
  const int64_t num_items = (int64_t)T * nkv * num_sub;

#pragma omp parallel for num_threads(num_thr) if (num_items > 1) schedule(dynamic, 1)
  for (int64_t item = 0; item < num_items; item++) {
    int t = (int)(item / (nkv * num_sub)), rest = (int)(item % (nkv * num_sub));
    int kvh = rest / num_sub, sub = rest % num_sub;
    int seq = att_seq_of(b, t), h0 = kvh * group + sub * gsz;
    int nh = group - sub * gsz < gsz ? group - sub * gsz : gsz;
    att_heads(o, qs, kc, vc, kv, b, ap, t, seq, kvh, h0, nh);
  }
  return 0;
}
