/* cuda_sample.cu - token sampling on the GPU over F32 logits: greedy (argmax) and
 * temperature / top-k / top-p / min-p with a host-drawn uniform u (see backend_ops.sample).
 *
 * One thread block per row. No sort: each cut-off is a threshold on a monotonic 32-bit key of the
 * logit, found bit by bit (32 passes over the row, each a block-wide count or sum), so the kept set
 * is exactly "every token whose logit is at least the threshold"; ties at a threshold are kept
 * together. Unnormalised probabilities w = exp((logit - max) / temperature) lie in (0, 1]. */
#include "backend/cuda/cuda_backend.h"

#include <stdlib.h>

#define SAMPLE_THREADS 1024

/* Monotonic map of a float to uint32: a < b  <=>  key(a) < key(b) (NaN aside). */
__device__ __forceinline__ uint32_t sample_key(float f) {
  uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ float sample_block_sum(float v, float *sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0)
    sh[wid] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float sample_block_max(float v, float *sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0)
    sh[wid] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? sh[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* (value, index) argmax over the block; ties go to the lower index. Result valid in all threads. */
__device__ int sample_block_argmax(float v, int idx, float *shv, int *shi) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  __syncthreads();
  if (lane == 0) {
    shv[wid] = v;
    shi[wid] = idx;
  }
  __syncthreads();
  if (lane < (int)(blockDim.x >> 5)) {
    v = shv[lane];
    idx = shi[lane];
  } else {
    v = -INFINITY;
    idx = 0x7fffffff;
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  return idx;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(int32_t *tokens,                            /* (n) */
                  const float *logits,                        /* (n, vocab) */
                  const struct backend_sample_params *params, /* (n) */
                  const int32_t *rows,                        /* (n) logits row of each entry; NULL: i */
                  int vocab) {
  __shared__ float shf[32];
  __shared__ int shi[32];
  __shared__ float chunk_sum[SAMPLE_THREADS];
  int row = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  const float *x = logits + (size_t)(rows ? rows[row] : row) * vocab;
  struct backend_sample_params p = params[row];

  /* argmax (also the answer for greedy rows and for top_k == 1) */
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = tid; i < vocab; i += nt)
    if (x[i] > bv || (x[i] == bv && i < bi)) {
      bv = x[i];
      bi = i;
    }
  int amax = sample_block_argmax(bv, bi, shf, shi);
  if (p.temperature <= 0.0f || p.top_k == 1) {
    if (tid == 0)
      tokens[row] = amax == 0x7fffffff ? 0 : amax;
    return;
  }
  float mx = x[amax];
  float inv_t = 1.0f / p.temperature;

  /* top_k: the largest key threshold with at least k logits at or above it */
  uint32_t thr = 0;
  if (p.top_k > 1 && p.top_k < vocab) {
    for (int bit = 31; bit >= 0; bit--) {
      uint32_t cand = thr | (1u << bit);
      float cnt = 0.0f;
      for (int i = tid; i < vocab; i += nt)
        cnt += sample_key(x[i]) >= cand ? 1.0f : 0.0f;
      if (sample_block_sum(cnt, shf) >= (float)p.top_k)
        thr = cand;
    }
  }
  /* top_p: the largest threshold (at least thr) whose kept mass reaches top_p of the mass kept
   * by top_k; that keeps the smallest set of most likely tokens whose mass crosses top_p. */
  if (p.top_p < 1.0f) {
    float z = 0.0f;
    for (int i = tid; i < vocab; i += nt)
      if (sample_key(x[i]) >= thr)
        z += __expf((x[i] - mx) * inv_t);
    float target = p.top_p * sample_block_sum(z, shf);
    /* S(c) = mass of the top_k-kept tokens with key >= c is non-increasing in c, and S(0) = z
     * reaches the target, so the bit-by-bit search from 0 finds the largest such c. */
    uint32_t t2 = 0;
    for (int bit = 31; bit >= 0; bit--) {
      uint32_t cand = t2 | (1u << bit);
      uint32_t c = cand > thr ? cand : thr;
      float s = 0.0f;
      for (int i = tid; i < vocab; i += nt)
        if (sample_key(x[i]) >= c)
          s += __expf((x[i] - mx) * inv_t);
      if (sample_block_sum(s, shf) >= target)
        t2 = cand;
    }
    if (t2 > thr)
      thr = t2;
  }
  /* min_p: keep w >= min_p * (largest w = 1); applied per element below */
  float min_w = p.min_p > 0.0f ? p.min_p : 0.0f;

  /* selection: thread tid owns the contiguous ids [lo, hi); a block scan of the chunk sums finds
   * the chunk where the running sum crosses u * total, and its owner walks it. */
  int per = (vocab + nt - 1) / nt;
  int lo = tid * per, hi = lo + per < vocab ? lo + per : vocab;
  float cs = 0.0f;
  for (int i = lo; i < hi; i++) {
    float w = __expf((x[i] - mx) * inv_t);
    if (sample_key(x[i]) >= thr && w >= min_w)
      cs += w;
  }
  chunk_sum[tid] = cs;
  __syncthreads();
  /* inclusive scan (Hillis-Steele) over chunk_sum */
  for (int o = 1; o < nt; o <<= 1) {
    float add = tid >= o ? chunk_sum[tid - o] : 0.0f;
    __syncthreads();
    chunk_sum[tid] += add;
    __syncthreads();
  }
  float total = chunk_sum[nt - 1];
  float target = p.u * total;
  float before = tid > 0 ? chunk_sum[tid - 1] : 0.0f;
  __shared__ int chosen;
  if (tid == 0)
    chosen = amax; /* fallback when rounding leaves the target at the very end */
  __syncthreads();
  if (before <= target && target < chunk_sum[tid] && lo < hi) {
    /* the mass to pass inside this chunk, summed from 0: adding each w to the running total itself
     * would round at the total's ulp once per token (~126 times, up to ~1e-5 of the mass) */
    float rem = target - before, run = 0.0f;
    int pick = -1, last = -1;
    for (int i = lo; i < hi; i++) {
      float w = __expf((x[i] - mx) * inv_t);
      if (sample_key(x[i]) >= thr && w >= min_w) {
        last = i;
        run += w;
        if (run > rem) {
          pick = i;
          break;
        }
      }
    }
    chosen = pick >= 0 ? pick : (last >= 0 ? last : amax);
  }
  __syncthreads();
  if (tid == 0)
    tokens[row] = chosen;
}

/* Entries [r0, r0 + nr) per launch (nr <= sample_cap): parameters (and the row map) up, one
 * launch, the tokens down, one sync. */
static int sample_launch(struct cuda_backend *cb, int32_t *tokens, const float *logits, const int32_t *rows, int n,
                         int vocab, const struct backend_sample_params *params) {
  if (vocab <= 0)
    return ERR("cuda sample: vocab %d", vocab);
  for (int r0 = 0; r0 < n; r0 += cb->sample_cap) {
    int nr = n - r0 < cb->sample_cap ? n - r0 : cb->sample_cap;
    memcpy(cb->sample_params_host, params + r0, sizeof *params * nr);
    CUDA_CHECK(cudaMemcpyAsync(cb->sample_params_dev, cb->sample_params_host, sizeof *params * nr,
                               cudaMemcpyHostToDevice, cb->stream));
    const float *base = logits + (size_t)r0 * vocab;
    if (rows) {
      memcpy(cb->sample_rows_host, rows + r0, sizeof(int32_t) * nr);
      CUDA_CHECK(cudaMemcpyAsync(cb->sample_rows_dev, cb->sample_rows_host, sizeof(int32_t) * nr,
                                 cudaMemcpyHostToDevice, cb->stream));
      base = logits;
    }
    sample_kernel<<<nr, SAMPLE_THREADS, 0, cb->stream>>>(cb->sample_tokens_dev, base, cb->sample_params_dev,
                                                        rows ? cb->sample_rows_dev : NULL, vocab);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(cb->sample_tokens_host, cb->sample_tokens_dev, sizeof(int32_t) * nr,
                               cudaMemcpyDeviceToHost, cb->stream));
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
    memcpy(tokens + r0, cb->sample_tokens_host, sizeof(int32_t) * nr);
  }
  return 0;
}

int cuda_op_sample(struct backend *be, int32_t *tokens, const float *logits, int n, int vocab,
                   const struct backend_sample_params *params) {
  return sample_launch(cuda_be(be), tokens, logits, NULL, n, vocab, params);
}

int cuda_op_sample_rows(struct backend *be, int32_t *tokens, const float *logits, const int32_t *rows, int n,
                        int vocab, const struct backend_sample_params *params) {
  return sample_launch(cuda_be(be), tokens, logits, rows, n, vocab, params);
}

/* ---- Asynchronous steps: sample_async / sample_wait / resolve_ids (backend.h) ---- */

void cuda_step_timing_start(struct cuda_backend *cb) {
  if (cb->step_timing && cudaEventRecord(cb->st_start[cb->st_steps % 4], cb->stream) == cudaSuccess)
    cb->st_have_start = 1;
}

void cuda_step_timing_report(struct cuda_backend *cb) {
  if (!cb->step_timing)
    return;
  if (cb->st_n > 0)
    log_info("cuda step timing: %lld asynchronous steps after the first 16: GPU busy %.4f ms, idle %.4f ms per "
             "step on average (idle at most %.4f ms; busy = batch copy up to ids copy down)",
             cb->st_n, cb->st_busy_ms / (double)cb->st_n, cb->st_idle_ms / (double)cb->st_n, cb->st_idle_max_ms);
  for (int i = 0; i < 4; i++) {
    cudaEventDestroy(cb->st_start[i]);
    cudaEventDestroy(cb->st_end[i]);
  }
  cb->step_timing = 0;
}

void cuda_async_free(struct cuda_backend *cb) {
  for (int i = 0; i < 2; i++) {
    struct cuda_async_slot *a = &cb->async[i];
    cudaFree(a->tokens_dev);
    cudaFree(a->stage_dev);
    cudaFreeHost(a->tokens_host);
    cudaFreeHost(a->stage_host);
    if (a->done)
      cudaEventDestroy(a->done);
    memset(a, 0, sizeof *a);
  }
}

int cuda_async_alloc(struct cuda_backend *cb, int rows) {
  cuda_async_free(cb);
  size_t stage = (sizeof(struct backend_sample_params) + sizeof(int32_t)) * (size_t)rows;
  for (int i = 0; i < 2; i++) {
    struct cuda_async_slot *a = &cb->async[i];
    CUDA_CHECK(cudaMalloc(&a->tokens_dev, sizeof(int32_t) * rows));
    CUDA_CHECK(cudaMallocHost(&a->tokens_host, sizeof(int32_t) * rows));
    CUDA_CHECK(cudaMalloc(&a->stage_dev, stage));
    CUDA_CHECK(cudaMallocHost(&a->stage_host, stage));
    CUDA_CHECK(cudaEventCreateWithFlags(&a->done, cudaEventDisableTiming));
    CUDA_CHECK(cudaMemset(a->tokens_dev, 0, sizeof(int32_t) * rows));
  }
  const char *st = getenv("PAGODA_STEP_TIMING");
  if (st && !strcmp(st, "1") && !cb->step_timing) {
    for (int i = 0; i < 4; i++) {
      CUDA_CHECK(cudaEventCreate(&cb->st_start[i]));
      CUDA_CHECK(cudaEventCreate(&cb->st_end[i]));
    }
    cb->step_timing = 1;
  }
  return 0;
}

/* Parameters and rows up in one copy from the slot's pinned staging, one launch, the ids down to
 * the slot's pinned buffer, the slot's event. No sync. */
int cuda_op_sample_async(struct backend *be, int slot, const float *logits, const int32_t *rows, int n, int vocab,
                         const struct backend_sample_params *params) {
  struct cuda_backend *cb = cuda_be(be);
  if (slot < 0 || slot > 1 || n < 0 || n > cb->sample_cap || vocab <= 0 || !rows)
    return ERR("cuda sample_async: slot %d, %d entries (at most %d), vocab %d", slot, n, cb->sample_cap, vocab);
  struct cuda_async_slot *a = &cb->async[slot];
  if (n) {
    size_t pb = sizeof *params * (size_t)n, rb = sizeof(int32_t) * (size_t)n;
    memcpy(a->stage_host, params, pb);
    memcpy((char *)a->stage_host + pb, rows, rb);
    CUDA_CHECK(cudaMemcpyAsync(a->stage_dev, a->stage_host, pb + rb, cudaMemcpyHostToDevice, cb->stream));
    sample_kernel<<<n, SAMPLE_THREADS, 0, cb->stream>>>(a->tokens_dev, logits,
                                                       (const struct backend_sample_params *)a->stage_dev,
                                                       (const int32_t *)((char *)a->stage_dev + pb), vocab);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(a->tokens_host, a->tokens_dev, rb, cudaMemcpyDeviceToHost, cb->stream));
  }
  if (cb->step_timing) {
    int k = (int)(cb->st_steps % 4);
    if (!cb->st_have_start)
      CUDA_CHECK(cudaEventRecord(cb->st_start[k], cb->stream));
    CUDA_CHECK(cudaEventRecord(cb->st_end[k], cb->stream));
    cb->st_slot_step[slot] = cb->st_steps++;
    cb->st_have_start = 0;
  }
  CUDA_CHECK(cudaEventRecord(a->done, cb->stream));
  return 0;
}

int cuda_op_sample_wait(struct backend *be, int slot, int32_t *tokens, int n) {
  struct cuda_backend *cb = cuda_be(be);
  if (slot < 0 || slot > 1 || n < 0 || n > cb->sample_cap)
    return ERR("cuda sample_wait: slot %d, %d entries (at most %d)", slot, n, cb->sample_cap);
  CUDA_CHECK(cudaEventSynchronize(cb->async[slot].done));
  long long st = cb->st_slot_step[slot];
  if (cb->step_timing && st >= 16 && cb->st_steps - st <= 2) { /* its events (and the step before's) intact */
    float busy = 0, idle = 0;
    CUDA_CHECK(cudaEventElapsedTime(&busy, cb->st_start[st % 4], cb->st_end[st % 4]));
    CUDA_CHECK(cudaEventElapsedTime(&idle, cb->st_end[(st - 1) % 4], cb->st_start[st % 4]));
    cb->st_busy_ms += busy;
    cb->st_idle_ms += idle > 0 ? idle : 0;
    cb->st_idle_max_ms = idle > cb->st_idle_max_ms ? idle : cb->st_idle_max_ms;
    cb->st_n++;
  }
  if (n)
    memcpy(tokens, cb->async[slot].tokens_host, sizeof(int32_t) * (size_t)n);
  return 0;
}

__global__ void resolve_ids_kernel(int32_t *ids, int T, const int32_t *slot0, const int32_t *slot1, int stride) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T && ids[t] < 0) {
    int k = -1 - ids[t];
    ids[t] = (k < stride ? slot0 : slot1)[k % stride];
  }
}

/* Under single-process tensor parallelism a rank > 0 reads rank 0's slots (its GPU's memory, peer
 * access enabled by peer_ar_connect) once rank 0's stream has written them (their events). */
int cuda_op_resolve_ids(struct backend *be, int32_t *ids, int T, int stride) {
  struct cuda_backend *cb = cuda_be(be), *src = cb->peer_ar.ids_src ? cb->peer_ar.ids_src : cb;
  if (T < 0 || stride < 1 || stride > src->sample_cap || !src->async[0].tokens_dev)
    return ERR("cuda resolve_ids: %d ids, stride %d (at most %d)", T, stride, src->sample_cap);
  if (T == 0)
    return 0;
  if (src != cb)
    for (int k = 0; k < 2; k++)
      CUDA_CHECK(cudaStreamWaitEvent(cb->stream, src->async[k].done, 0));
  resolve_ids_kernel<<<(T + 255) / 256, 256, 0, cb->stream>>>(ids, T, src->async[0].tokens_dev,
                                                               src->async[1].tokens_dev, stride);
  CUDA_LAUNCH_CHECK();
  return 0;
}

/* One thread per entry (distinct tokens per row, so no two threads touch one logit). Every
 * operation is rounded as the host's (--use_fast_math would otherwise turn the division into an
 * approximation), so the result is bitwise sampler_apply_processors'. */
__global__ void process_kernel(float *logits, int vocab, const struct backend_proc_entry *entries, int n,
                               const float *bias) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  struct backend_proc_entry e = entries[i];
  float *p = logits + (size_t)e.row * vocab + e.id;
  float l = *p;
  for (int b = 0; b < e.num_bias; b++)
    l = __fadd_rn(l, bias[e.bias0 + b]);
  if (e.rep != 1.0f)
    l = l > 0 ? __fdiv_rn(l, e.rep) : __fmul_rn(l, e.rep);
  if (e.sub != 0.0f)
    l = __fsub_rn(l, e.sub);
  if (e.suppress)
    l = -INFINITY;
  *p = l;
}

int cuda_op_process(struct backend *be, float *logits, int vocab, const struct backend_proc_entry *entries, int n,
                    const float *bias, int num_bias) {
  struct cuda_backend *cb = cuda_be(be);
  if (n <= 0)
    return n == 0 ? 0 : ERR("cuda process: %d entries", n);
  size_t eb = sizeof *entries * (size_t)n, bb = sizeof(float) * (size_t)num_bias, need = eb + bb;
  if (need > cb->proc_bytes) { /* grows to the largest step seen (a sync: rare, never per token) */
    size_t cap = cb->proc_bytes ? cb->proc_bytes : (size_t)1 << 16;
    while (cap < need)
      cap *= 2;
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
    cudaFree(cb->proc_dev);
    cudaFreeHost(cb->proc_host);
    cb->proc_dev = cb->proc_host = NULL;
    cb->proc_bytes = 0;
    CUDA_CHECK(cudaMalloc(&cb->proc_dev, cap));
    CUDA_CHECK(cudaMallocHost(&cb->proc_host, 2 * cap));
    cb->proc_bytes = cap;
  }
  /* Two pinned halves used in turn: one call per step, and the step before the previous one
   * has been read back (its copy up long done) before the engine stages the next. */
  char *host = (char *)cb->proc_host + (size_t)cb->proc_half * cb->proc_bytes;
  cb->proc_half ^= 1;
  memcpy(host, entries, eb);
  if (bb)
    memcpy(host + eb, bias, bb);
  CUDA_CHECK(cudaMemcpyAsync(cb->proc_dev, host, need, cudaMemcpyHostToDevice, cb->stream));
  process_kernel<<<(n + 255) / 256, 256, 0, cb->stream>>>(logits, vocab, (const struct backend_proc_entry *)cb->proc_dev,
                                                          n, (const float *)((char *)cb->proc_dev + eb));
  CUDA_LAUNCH_CHECK();
  return 0;
}

/* One block per row: the max, then the sum of exp(x - max) in double (each thread's share, then
 * the block), then x[target] - max - log(sum), as engine_prompt_logprobs computes it on the host. */
__global__ void logprob_kernel(float *out, const float *logits, const int32_t *targets, int vocab) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const float *x = logits + (size_t)blockIdx.x * vocab;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    mx = fmaxf(mx, x[i]);
  mx = sample_block_max(mx, shf);
  double sum = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    sum += exp((double)x[i] - (double)mx);
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();
  if (lane == 0)
    shd[wid] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
      total += shd[w];
    out[blockIdx.x] = (float)((double)x[targets[blockIdx.x]] - (double)mx - log(total));
  }
}

int cuda_op_logprob_rows(struct backend *be, float *out, const float *logits, int n, int vocab,
                         const int32_t *targets) {
  struct cuda_backend *cb = cuda_be(be);
  if (n < 0 || n > cb->sample_cap || vocab <= 0)
    return ERR("cuda logprob_rows: %d rows (at most %d) of vocab %d", n, cb->sample_cap, vocab);
  if (n == 0)
    return 0;
  for (int i = 0; i < n; i++)
    if (targets[i] < 0 || targets[i] >= vocab)
      return ERR("cuda logprob_rows: target %d outside the vocabulary of %d", targets[i], vocab);
  memcpy(cb->sample_tokens_host, targets, sizeof(int32_t) * n);
  CUDA_CHECK(cudaMemcpyAsync(cb->sample_tokens_dev, cb->sample_tokens_host, sizeof(int32_t) * n,
                             cudaMemcpyHostToDevice, cb->stream));
  logprob_kernel<<<n, 256, 0, cb->stream>>>(cb->lp_out_dev, logits, cb->sample_tokens_dev, vocab);
  CUDA_LAUNCH_CHECK();
  CUDA_CHECK(cudaMemcpyAsync(cb->lp_out_host, cb->lp_out_dev, sizeof(float) * n, cudaMemcpyDeviceToHost,
                             cb->stream));
  CUDA_CHECK(cudaStreamSynchronize(cb->stream));
  memcpy(out, cb->lp_out_host, sizeof(float) * n);
  return 0;
}

/* ---- top-k log-probabilities (logprobs + top logprobs, beam candidates) ---- */

/* One block per entry. lse as sequence_save_raw: mx, then the sum of exp((double)(x - mx)) (the
 * difference in f32, as the host), lse = (float)(mx + log(sum)). The k-th largest key is found
 * bit by bit as in sample_kernel (count of keys at or above a candidate); every id with a larger
 * key is kept, then the lowest ids holding the k-th key (a block scan over contiguous chunks, so
 * ties go to the lower id); the k kept are ranked in shared memory by (value desc, id asc). */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    topk_kernel(int32_t *ids, float *lps, float *tlp, const float *logits, const int32_t *rows,
                const int32_t *targets, int vocab, int k) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ float kv[BACKEND_TOPK_MAX];
  __shared__ int ki[BACKEND_TOPK_MAX];
  __shared__ int chunk[SAMPLE_THREADS];
  __shared__ int num_gt;
  __shared__ float lse_sh;
  int e = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  const float *x = logits + (size_t)rows[e] * vocab;
  float mx = -INFINITY;
  for (int i = tid; i < vocab; i += nt)
    mx = fmaxf(mx, x[i]);
  mx = sample_block_max(mx, shf);
  double sum = 0;
  for (int i = tid; i < vocab; i += nt)
    sum += exp((double)__fsub_rn(x[i], mx));
  int lane = tid & 31, wid = tid >> 5;
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0)
    shd[wid] = sum;
  if (tid == 0)
    num_gt = 0;
  __syncthreads();
  if (tid == 0) {
    double total = 0;
    for (int w = 0; w < (nt >> 5); w++)
      total += shd[w];
    lse_sh = (float)((double)mx + log(total));
    if (targets)
      tlp[e] = __fsub_rn(x[targets[e]], lse_sh);
  }
  __syncthreads();
  float lse = lse_sh;
  if (k <= 0)
    return;
  uint32_t thr = 0; /* the largest key with at least k keys at or above it */
  for (int bit = 31; bit >= 0; bit--) {
    uint32_t cand = thr | (1u << bit);
    float cnt = 0.0f;
    for (int i = tid; i < vocab; i += nt)
      cnt += sample_key(x[i]) >= cand ? 1.0f : 0.0f;
    if (sample_block_sum(cnt, shf) >= (float)k)
      thr = cand;
  }
  for (int i = tid; i < vocab; i += nt) /* fewer than k keys lie above thr */
    if (sample_key(x[i]) > thr) {
      int at = atomicAdd(&num_gt, 1);
      kv[at] = x[i];
      ki[at] = i;
    }
  int per = (vocab + nt - 1) / nt;
  int lo = tid * per, hi = lo + per < vocab ? lo + per : vocab;
  int c = 0;
  for (int i = lo; i < hi; i++)
    c += sample_key(x[i]) == thr;
  chunk[tid] = c;
  __syncthreads();
  for (int o = 1; o < nt; o <<= 1) { /* inclusive scan */
    int add = tid >= o ? chunk[tid - o] : 0;
    __syncthreads();
    chunk[tid] += add;
    __syncthreads();
  }
  int at = num_gt + chunk[tid] - c;
  for (int i = lo; i < hi && at < k; i++)
    if (sample_key(x[i]) == thr) {
      kv[at] = x[i];
      ki[at++] = i;
    }
  __syncthreads();
  if (tid < k) {
    float v = kv[tid];
    int id = ki[tid], rank = 0;
    for (int j = 0; j < k; j++)
      rank += kv[j] > v || (kv[j] == v && ki[j] < id);
    ids[(size_t)e * k + rank] = id;
    lps[(size_t)e * k + rank] = __fsub_rn(v, lse);
  }
}

void cuda_sample_free(struct cuda_backend *cb) {
  cudaFree(cb->topk_dev);
  cudaFreeHost(cb->topk_host);
  cudaFree(cb->stash);
  cb->topk_dev = cb->topk_host = NULL;
  cb->stash = NULL;
  cb->topk_bytes = cb->stash_floats = 0;
}

int cuda_op_stash_rows(struct backend *be, const float *logits, int vocab, const int32_t *rows, int n) {
  struct cuda_backend *cb = cuda_be(be);
  if (n <= 0 || vocab <= 0)
    return n == 0 ? 0 : ERR("cuda stash_rows: %d rows", n);
  size_t need = (size_t)n * vocab;
  if (need > cb->stash_floats) { /* grows to the most logprob rows of a step; the stream was idle since the last sync */
    size_t cap = cb->stash_floats ? cb->stash_floats : need;
    while (cap < need)
      cap *= 2;
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
    cudaFree(cb->stash);
    cb->stash = NULL;
    cb->stash_floats = 0;
    CUDA_CHECK(cudaMalloc(&cb->stash, cap * sizeof(float)));
    cb->stash_floats = cap;
  }
  for (int i = 0; i < n; i++)
    CUDA_CHECK(cudaMemcpyAsync(cb->stash + (size_t)i * vocab, logits + (size_t)rows[i] * vocab,
                               sizeof(float) * vocab, cudaMemcpyDeviceToDevice, cb->stream));
  return 0;
}

int cuda_op_topk_rows(struct backend *be, int32_t *ids, float *lps, float *tlp, const float *logits, int vocab,
                      const int32_t *rows, const int32_t *targets, int n, int k) {
  struct cuda_backend *cb = cuda_be(be);
  if (n < 0 || k < 0 || k > BACKEND_TOPK_MAX || k > vocab || vocab <= 0)
    return ERR("cuda topk_rows: %d entries, k %d (at most %d and the vocabulary of %d)", n, k, BACKEND_TOPK_MAX,
               vocab);
  if (n == 0)
    return 0;
  if (!logits)
    logits = cb->stash;
  for (int i = 0; i < n; i++)
    if ((targets && (targets[i] < 0 || targets[i] >= vocab)) || rows[i] < 0)
      return ERR("cuda topk_rows: entry %d: row %d, target %d outside the vocabulary of %d", i, rows[i],
                 targets ? targets[i] : 0, vocab);
  /* layout: rows(n) targets(n) | ids(n k) lps(n k) tlp(n) */
  size_t up = sizeof(int32_t) * 2 * (size_t)n, down = (sizeof(int32_t) + sizeof(float)) * (size_t)n * k +
                                                       sizeof(float) * (size_t)n;
  size_t need = up + down;
  if (need > cb->topk_bytes) {
    size_t cap = cb->topk_bytes ? cb->topk_bytes : (size_t)1 << 14;
    while (cap < need)
      cap *= 2;
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
    cudaFree(cb->topk_dev);
    cudaFreeHost(cb->topk_host);
    cb->topk_dev = cb->topk_host = NULL;
    cb->topk_bytes = 0;
    CUDA_CHECK(cudaMalloc(&cb->topk_dev, cap));
    CUDA_CHECK(cudaMallocHost(&cb->topk_host, cap));
    cb->topk_bytes = cap;
  }
  char *h = (char *)cb->topk_host, *d = (char *)cb->topk_dev;
  memcpy(h, rows, sizeof(int32_t) * n);
  if (targets)
    memcpy(h + sizeof(int32_t) * n, targets, sizeof(int32_t) * n);
  CUDA_CHECK(cudaMemcpyAsync(d, h, up, cudaMemcpyHostToDevice, cb->stream));
  int32_t *d_ids = (int32_t *)(d + up);
  float *d_lps = (float *)(d + up + sizeof(int32_t) * (size_t)n * k);
  float *d_tlp = d_lps + (size_t)n * k;
  topk_kernel<<<n, SAMPLE_THREADS, 0, cb->stream>>>(d_ids, d_lps, d_tlp, logits, (const int32_t *)d,
                                                    targets ? (const int32_t *)d + n : NULL, vocab, k);
  CUDA_LAUNCH_CHECK();
  CUDA_CHECK(cudaMemcpyAsync(h + up, d + up, down, cudaMemcpyDeviceToHost, cb->stream));
  CUDA_CHECK(cudaStreamSynchronize(cb->stream));
  memcpy(ids, h + up, sizeof(int32_t) * (size_t)n * k);
  memcpy(lps, h + up + sizeof(int32_t) * (size_t)n * k, sizeof(float) * (size_t)n * k);
  if (tlp)
    memcpy(tlp, h + up + (sizeof(int32_t) + sizeof(float)) * (size_t)n * k, sizeof(float) * n);
  return 0;
}

CUDA_PRELOAD_ANCHOR(sample)
