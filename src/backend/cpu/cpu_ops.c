/* cpu_ops.c - the CPU backend's row-wise ops: embed, rmsnorm, rope, silu_mul, KV writes, copies. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "util/dtype.h"
#include "util/log.h"

int cpu_embed(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T) {
  (void)be;
  float *o = out; /* (T, dim) */
  int64_t dim = emb->cols;
  size_t row_bytes = dtype_row_bytes(emb->dtype, dim);
  for (int t = 0; t < T; t++)
    if (ids[t] < 0 || ids[t] >= emb->rows)
      return ERR("token id %d out of range (vocabulary of %lld)", ids[t], (long long)emb->rows);
  for (int t = 0; t < T; t++)
    dtype_to_f32(o + (size_t)t * dim, (const char *)emb->data + row_bytes * (size_t)ids[t], emb->dtype,
                 dim);
  return 0;
}

int cpu_rmsnorm(struct backend *be, void *out, void *residual, const void *x, const struct weight *w,
                int T, int dim, float eps) {
  if (w->cols != dim || dtype_is_quant(w->dtype))
    return ERR("rmsnorm: weight of %lld %s elements for dim %d", (long long)w->cols,
               dtype_name(w->dtype), dim);
  float *o = out;              /* (T, dim) */
  float *res = residual;       /* (T, dim) or NULL */
  const float *xs = x;         /* (T, dim) */
#pragma omp parallel for num_threads(cpu_threads_for(be, (int64_t)T * dim * 4)) if (T > 1) schedule(static)
  for (int t = 0; t < T; t++) {
    float *r = res ? res + (size_t)t * dim : NULL;
    const float *xi = xs + (size_t)t * dim;
    if (r) {
      for (int i = 0; i < dim; i++)
        r[i] += xi[i];
      xi = r;
    }
    /* As ggml's rms_norm: each square rounded to f32, summed in double in order, the mean and
     * 1 / sqrt(mean + eps) in f32; then (x * scale) * w. */
    double ss = 0;
    for (int i = 0; i < dim; i++)
      ss += (double)(xi[i] * xi[i]);
    float mean = (float)(ss / dim);
    float inv = 1.0f / sqrtf(mean + eps);
    float *oi = o + (size_t)t * dim;
    if (w->dtype == DTYPE_F32) {
      const float *wf = w->data;
      for (int i = 0; i < dim; i++)
        oi[i] = xi[i] * inv * wf[i];
    } else {
      for (int i = 0; i < dim; i++)
        oi[i] = xi[i] * inv * cpu_weight_elem(w, i);
    }
  }
  return 0;
}

/* Rotates one head's pairs: neox pairs (i, i + half), interleaved pairs (2i, 2i + 1). */
static void rope_head(float *v, const float *cs, const float *sn, int half, int neox) {
  for (int i = 0; i < half; i++) {
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float x0 = v[a], x1 = v[b];
    /* the products and differences as ggml's rope compiles them (contracted to FMAs) */
    v[a] = fmaf(x0, cs[i], -(x1 * sn[i]));
    v[b] = fmaf(x0, sn[i], x1 * cs[i]);
  }
}

int cpu_rope(struct backend *be, void *q, void *k, const int32_t *positions, int T, int n_heads,
             int n_kv_heads, int head_dim, const struct rope_params *rp) {
  int half = rp->rot_dim / 2;
  if (rp->rot_dim <= 0 || rp->rot_dim > head_dim || rp->rot_dim % 2 || head_dim > CPU_MAX_HEAD_DIM)
    return ERR("rope: rot_dim %d with head_dim %d", rp->rot_dim, head_dim);
  float *qs = q; /* (T, n_heads, head_dim) */
  float *ks = k; /* (T, n_kv_heads, head_dim) */
  /* ggml's angles when inv_freq is the plain theta^(-2i/d) (no scaling): position * s^i with s =
   * inv_freq[1], the product taken step by step in f32, then cosf/sinf. Otherwise (llama3 or
   * linear scaling, rope_freqs) position * inv_freq[i] in f32 (as HF), cos/sin accurately. */
  int iterate = half > 1 && rp->inv_freq[0] == 1.0f && !rp->inv_freq_long && rp->mscale == 0;
  for (int i = 1; iterate && i < half; i++) {
    float p = 1.0f;
    for (int j = 0; j < i; j++)
      p *= rp->inv_freq[1];
    iterate = fabsf(p - rp->inv_freq[i]) <= 1e-5f * rp->inv_freq[i];
  }
#pragma omp parallel for num_threads(cpu_threads_for(be, (int64_t)T * (half * 16 + (n_heads + n_kv_heads) * head_dim))) if (T > 1) schedule(static)
  for (int t = 0; t < T; t++) {
    float cs[CPU_MAX_HEAD_DIM / 2], sn[CPU_MAX_HEAD_DIM / 2];
    const float *inv_freq = rp->inv_freq;
    if (rp->inv_freq_long) { /* LongRoPE: the sequence holding t, by binary search */
      int lo = 0, hi = rp->num_seqs - 1;
      while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (rp->query_start[mid] <= t)
          lo = mid;
        else
          hi = mid - 1;
      }
      if (rp->seq_lens[lo] > rp->long_after)
        inv_freq = rp->inv_freq_long;
    }
    float theta = (float)positions[t];
    for (int i = 0; i < half; i++) {
      if (iterate) {
        cs[i] = cosf(theta);
        sn[i] = sinf(theta);
        theta *= rp->inv_freq[1];
        continue;
      }
      /* The angle is rounded to f32 as in HF (position * inv_freq in float32); cos/sin of it are
       * then taken accurately. */
      float ang = (float)positions[t] * inv_freq[i];
      cs[i] = (float)cos((double)ang);
      sn[i] = (float)sin((double)ang);
      if (rp->mscale != 0) { /* as transformers: cos * factor, sin * factor in f32 */
        cs[i] *= rp->mscale;
        sn[i] *= rp->mscale;
      }
    }
    for (int h = 0; h < n_heads; h++)
      rope_head(qs + ((size_t)t * n_heads + h) * head_dim, cs, sn, half, rp->neox);
    for (int h = 0; h < n_kv_heads; h++)
      rope_head(ks + ((size_t)t * n_kv_heads + h) * head_dim, cs, sn, half, rp->neox);
  }
  return 0;
}

/* e^x as ggml computes it in its vector silu (x86, |x| not huge): x = n ln2 + b with n
 * rounded to an integer by the 1.5 * 2^23 trick, ln2 split in two parts, a degree-5
 * polynomial in b, then scaled by 2^n; results beyond 2^+-192 saturate to 0 or infinity. Each
 * step is one f32 operation or one fused multiply-add, so it gives ggml's bits. */
static inline float cpu_expf(float x) {
  const float shift = 0x1.8p23f;
  float z = fmaf(x, 0x1.715476p+0f, shift), n = z - shift;
  float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  float u = b * b;
  float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                 fmaf(0x1.ffffecp-1f, b, 1.0f));
  if (fabsf(n) > 192.0f)
    return n <= 0.0f ? 0.0f : INFINITY;
  return scalbnf(j, (int)n);
}

int cpu_silu_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F) {
  float *o = out;         /* (T, F), may alias gate */
  const float *g = gate;  /* (T, F) */
  const float *u = up;    /* (T, F) */
  size_t n = (size_t)T * F;
#pragma omp parallel for num_threads(cpu_threads_for(be, (int64_t)n * 8)) if (n > 65536) schedule(static)
  for (size_t i = 0; i < n; i++)
    o[i] = g[i] / (1.0f + cpu_expf(-g[i])) * u[i];
  return 0;
}

int cpu_kv_write(struct backend *be, const struct kv_layer *kv, const void *k, const void *v,
                 const struct batch *b) {
  (void)be;
  if (kv->dtype != DTYPE_F32 && kv->dtype != DTYPE_F16 && kv->dtype != DTYPE_F8E4M3)
    return ERR("cpu backend: KV cache dtype %s is not supported (the CPU keeps K/V in f32, f16 or f8e4m3)",
               dtype_name(kv->dtype));
  size_t row = (size_t)kv->n_kv_heads * kv->head_dim;  /* one token's K (or V) */
  size_t head = (size_t)kv->head_dim;
  int64_t num_slots = (int64_t)kv->num_blocks * kv->block_size;
  const float *ks = k; /* (T, n_kv_heads, head_dim) */
  const float *vs = v; /* (T, n_kv_heads, head_dim) */
  float *kc = kv->k, *vc = kv->v; /* (num_blocks, n_kv_heads, block_size, head_dim) */
  uint16_t *kh = kv->k, *vh = kv->v; /* the same, when dtype is F16 */
  uint8_t *k8 = kv->k, *v8 = kv->v;  /* the same, when dtype is F8E4M3: x / scale, saturated */
  for (int t = 0; t < b->num_tokens; t++) {
    int64_t s = b->slot_mapping[t];
    if (s < 0)
      continue;
    if (s >= num_slots)
      return ERR("kv_write: slot %lld beyond the cache (%lld slots)", (long long)s, (long long)num_slots);
    int64_t blk = s / kv->block_size, off = s % kv->block_size;
    for (int h = 0; h < kv->n_kv_heads; h++) {
      size_t dst = (((size_t)blk * kv->n_kv_heads + h) * kv->block_size + (size_t)off) * head;
      const float *kr = ks + t * row + h * head, *vr = vs + t * row + h * head;
      if (kv->dtype == DTYPE_F16) {
        for (size_t i = 0; i < head; i++) {
          kh[dst + i] = f32_to_f16(kr[i]);
          vh[dst + i] = f32_to_f16(vr[i]);
        }
        continue;
      }
      if (kv->dtype == DTYPE_F8E4M3) {
        for (size_t i = 0; i < head; i++) {
          k8[dst + i] = f32_to_f8e4m3(kr[i] / kv->k_scale);
          v8[dst + i] = f32_to_f8e4m3(vr[i] / kv->v_scale);
        }
        continue;
      }
      memcpy(kc + dst, kr, head * sizeof(float));
      memcpy(vc + dst, vr, head * sizeof(float));
    }
  }
  return 0;
}

int cpu_gather_rows(struct backend *be, void *out, const void *x, const int32_t *idx, int n, int dim) {
  (void)be;
  float *o = out;        /* (n, dim) */
  const float *xs = x;   /* (rows, dim); idx must be valid rows (the model checks them) */
  for (int i = 0; i < n; i++)
    memcpy(o + (size_t)i * dim, xs + (size_t)idx[i] * dim, (size_t)dim * sizeof(float));
  return 0;
}

int cpu_copy_blocks(struct backend *be, struct kv_layer *layers, int n_layers, const int32_t *src,
                    const int32_t *dst, int n) {
  (void)be;
  for (int l = 0; l < n_layers; l++) {
    struct kv_layer *kv = &layers[l];
    if (kv->dtype != DTYPE_F32 && kv->dtype != DTYPE_F16 && kv->dtype != DTYPE_F8E4M3)
      return ERR("cpu backend: KV cache dtype %s is not supported", dtype_name(kv->dtype));
    size_t blk = (size_t)kv->n_kv_heads * kv->block_size * dtype_row_bytes(kv->dtype, kv->head_dim); /* bytes */
    for (int i = 0; i < n; i++) {
      if (src[i] < 0 || src[i] >= kv->num_blocks || dst[i] < 0 || dst[i] >= kv->num_blocks)
        return ERR("copy_blocks: block %d -> %d outside the pool of %d", src[i], dst[i], kv->num_blocks);
      memcpy((char *)kv->k + dst[i] * blk, (char *)kv->k + src[i] * blk, blk);
      memcpy((char *)kv->v + dst[i] * blk, (char *)kv->v + src[i] * blk, blk);
    }
  }
  return 0;
}
