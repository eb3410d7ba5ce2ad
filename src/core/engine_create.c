/* engine_create.c - engine parameters, creation (backend, model, tokenizer, workspace, KV pool
 * sized from the budget flags, scheduler, samplers) and free. See engine_impl.h. */
#include <omp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine_impl.h"
#include "dist/mp.h"
#include "dist/tp.h"
#include "model/model_file.h"
#include "util/log.h"

void pagoda_engine_params_default(struct pagoda_engine_params *p) {
  memset(p, 0, sizeof *p);
  p->block_size = 32;
  p->prefix_cache_n = 16;
  p->max_num_seqs = 256;
  p->max_num_batched_tokens = 8192;
  p->prefill_chunk_size = 4096;
  p->tp_rank = -1; /* $PAGODA_TP_RANK, else 0 */
}

void pagoda_sampling_params_default(struct pagoda_sampling_params *p) {
  memset(p, 0, sizeof *p);
  p->n = 1;
  p->temperature = 1;
  p->top_p = 1;
  p->seed = -1;
  p->max_tokens = -1;
  p->repetition_penalty = 1;
  p->length_penalty = 1;
  p->skip_special_tokens = 1;
}

/* The KV budget flags alone (before anything is loaded): at most one, each in range. */
static int check_budget_flags(const struct pagoda_engine_params *p) {
  int set = (p->pa_memory_mb > 0) + (p->pa_memory_fraction > 0) + (p->pa_context_len > 0);
  if (set > 1)
    return ERR("--pa-memory-mb, --pa-memory-fraction and --pa-context-len are mutually exclusive; give one");
  if (p->pa_memory_mb < 0 || p->pa_memory_fraction < 0 || p->pa_memory_fraction > 1 || p->pa_context_len < 0)
    return ERR("invalid KV budget: --pa-memory-mb must be > 0, --pa-memory-fraction in (0, 1], "
               "--pa-context-len > 0");
  return 0;
}

/* The budget is a fraction of the memory free after weights and workspace (no flag, or
 * --pa-memory-fraction), rather than a fixed size. */
static int budget_from_free_memory(const struct pagoda_engine_params *p) {
  return !(p->pa_memory_mb > 0) && !(p->pa_context_len > 0);
}

/* Sizes the pool from the one budget flag given: floor(budget / block_bytes) blocks, the null
 * block included, where budget is --pa-memory-mb MiB or the fraction (default 0.9) of AVAIL, the
 * bytes free after the weights, the workspace and (on a device) the profiling pass;
 * --pa-context-len N gives max_num_seqs * ceil(N / block_size) + 1 blocks. Without a flag the
 * pool is capped at max_num_seqs full-length sequences. Writes which flag sized it, and how, to
 * WHY (for the start-up log); returns blocks or -1. */
static int pool_blocks(const struct pagoda_engine *e, size_t block_bytes, size_t avail, const char *after,
                       char *why, size_t why_size) {
  const struct pagoda_engine_params *p = &e->p;
  long long full = (long long)p->max_num_seqs * e->max_blocks_per_seq + 1;
  long long blocks;
  const char *flag;
  char given[64];
  if (p->pa_context_len > 0) {
    blocks = (long long)p->max_num_seqs * ((p->pa_context_len + e->block_size - 1) / e->block_size) + 1;
    flag = "--pa-context-len";
    snprintf(given, sizeof given, "%d", p->pa_context_len);
    snprintf(why, why_size, "--pa-context-len %d (%d sequences)", p->pa_context_len, p->max_num_seqs);
  } else if (p->pa_memory_mb > 0) {
    blocks = (long long)(p->pa_memory_mb * 1048576.0 / (double)block_bytes);
    flag = "--pa-memory-mb";
    snprintf(given, sizeof given, "%g", p->pa_memory_mb);
    snprintf(why, why_size, "--pa-memory-mb %g", p->pa_memory_mb);
  } else {
    double frac = p->pa_memory_fraction > 0 ? p->pa_memory_fraction : 0.9;
    blocks = (long long)(frac * (double)avail / (double)block_bytes);
    flag = "--pa-memory-fraction";
    snprintf(given, sizeof given, "%g", frac);
    snprintf(why, why_size, "--pa-memory-fraction %g%s of %.2f GiB free after %s", frac,
             p->pa_memory_fraction > 0 ? "" : " (default)", (double)avail / 1073741824.0, after);
    if (p->pa_memory_fraction <= 0 && blocks > full) {
      blocks = full; /* no flag: never more than max_num_seqs full-length sequences can use */
      size_t n = strlen(why);
      snprintf(why + n, why_size - n, ", capped at %d sequences of %d tokens", p->max_num_seqs, e->max_model_len);
    }
  }
  if (blocks > 0x7fffffffLL - 1)
    blocks = 0x7fffffffLL - 1;
  if (blocks - 1 < e->max_blocks_per_seq)
    return ERR("the KV budget (%s %s) holds %lld blocks of %d tokens (%zu bytes each), less than one "
               "sequence of %d tokens (%d blocks): raise %s or lower --max-model-len",
               flag, given, blocks > 0 ? blocks - 1 : 0, e->block_size, block_bytes, e->max_model_len,
               e->max_blocks_per_seq, flag);
  return (int)blocks;
}

static int alloc_batch(struct pagoda_engine *e) {
  int T = e->p.max_num_batched_tokens, B = e->p.max_num_seqs;
  e->input_ids = malloc((size_t)T * 4);
  e->positions = malloc((size_t)T * 4);
  e->slots = malloc((size_t)T * 4);
  e->query_start = malloc((size_t)(B + 1) * 4);
  e->seq_lens = malloc((size_t)B * 4);
  e->block_tables = malloc((size_t)B * e->max_blocks_per_seq * 4);
  e->logits_idx = malloc((size_t)(B + T) * 4); /* sampling rows + prompt-logprob rows */
  e->lp_row0 = malloc((size_t)B * 4);
  e->lp_pos0 = malloc((size_t)B * 4);
  e->lp_num_rows = malloc((size_t)B * 4);
  e->logits_cap = B;
  e->logit_row = malloc((size_t)B * 4);
  e->logits = malloc((size_t)B * e->vocab * sizeof(float));
  e->copy_src = malloc((size_t)B * 4);
  e->copy_dst = malloc((size_t)B * 4);
  e->picked = malloc((size_t)B * 4);
  e->dev_params = malloc((size_t)B * sizeof *e->dev_params);
  e->dev_tokens = malloc((size_t)B * 4);
  e->lp_target = malloc((size_t)T * 4);
  e->lp_value = malloc((size_t)T * sizeof(float));
  if (!e->dev_params || !e->dev_tokens || !e->lp_target || !e->lp_value)
    return ERR("out of memory for the step buffers (lower --max-num-seqs)");
  if (!e->picked || !e->input_ids || !e->positions || !e->slots || !e->query_start || !e->seq_lens ||
      !e->block_tables || !e->logits_idx || !e->logit_row || !e->logits || !e->copy_src || !e->copy_dst ||
      !e->lp_row0 || !e->lp_pos0 || !e->lp_num_rows)
    return ERR("out of memory for the step buffers (lower --max-num-batched-tokens or --max-num-seqs)");
  return 0;
}

/* The KV dtype for --pa-cache-type. auto: the backend's caps.kv_auto, or caps.kv_auto_gguf for a
 * GGUF model (cpu: f16, the cache llama.cpp runs GGUF models with: its greedy outputs are the
 * reference users compare with, in half the memory; as vLLM's auto otherwise). An explicit
 * dtype must be one the backend's kernels implement (caps.kv_dtypes). */
static int kv_dtype_for(const struct pagoda_engine_params *p, const struct backend *be, enum dtype *out) {
  size_t n = strlen(p->model);
  int gguf = n >= 5 && strcmp(p->model + n - 5, ".gguf") == 0;
  switch (p->cache_type) {
  case PAGODA_CACHE_TYPE_AUTO: *out = gguf ? be->caps.kv_auto_gguf : be->caps.kv_auto; break;
  case PAGODA_CACHE_TYPE_F32: *out = DTYPE_F32; break;
  case PAGODA_CACHE_TYPE_F16: *out = DTYPE_F16; break;
  case PAGODA_CACHE_TYPE_BF16: *out = DTYPE_BF16; break;
  case PAGODA_CACHE_TYPE_F8E4M3: *out = DTYPE_F8E4M3; break;
  default: return ERR("--pa-cache-type: unknown value %d", (int)p->cache_type);
  }
  if (!backend_kv_dtype_ok(be, *out)) {
    char have[64] = "";
    for (int t = 0; t < 32; t++)
      if (be->caps.kv_dtypes >> t & 1u) {
        size_t k = strlen(have);
        snprintf(have + k, sizeof have - k, "%s%s", k ? ", " : "", dtype_name((enum dtype)t));
      }
    return ERR("--pa-cache-type %s is not supported by the %s backend (its kernels keep the KV cache in %s); "
               "use --pa-cache-type auto", dtype_name(*out), be->ops->name, have);
  }
  return 0;
}

const char *pagoda_default_model(void) { return PAGODA_DEFAULT_MODEL; }

/* --tp: 0 takes $PAGODA_TP (else 1). */
static int tp_resolve(struct pagoda_engine_params *p) {
  if (p->tp < 0 || p->tp > TP_MAX_WORLD)
    return ERR("--tp %d: must be 1 .. %d", p->tp, TP_MAX_WORLD);
  if (p->tp == 0) {
    const char *env = getenv("PAGODA_TP");
    p->tp = 1;
    if (env && *env) {
      char *end;
      long v = strtol(env, &end, 10);
      if (*end || v < 1 || v > TP_MAX_WORLD)
        return ERR("PAGODA_TP=%s: must be an integer 1 .. %d", env, TP_MAX_WORLD);
      p->tp = (int)v;
    }
  }
  return 0;
}

/* Tensor parallelism: the rank threads, then on each rank's thread its backend (GPU r: device
 * memory and the current device are per thread). Each rank captures and replays its own CUDA
 * graphs of the padded decode steps (model_forward_graph; docs/distributed.md). */
struct tp_setup_ctx {
  const struct pagoda_engine_params *p;
  struct backend **bes;
};

static int tp_create_rank(int r, void *ctx) {
  struct tp_setup_ctx *c = ctx;
  struct backend_params bp = {c->p->device, c->p->threads, r};
  if (!(c->bes[r] = backend_create(&bp)))
    return -1;
  return 0;
}

static int tp_destroy_rank(int r, void *ctx) {
  struct backend **bes = ctx;
  if (bes[r])
    bes[r]->ops->destroy(bes[r]);
  bes[r] = NULL;
  return 0;
}

static int tp_setup(struct pagoda_engine *e) {
  if (!(e->tp = tp_group_create(e->p.tp)) || !(e->tp_bes = calloc((size_t)e->p.tp, sizeof *e->tp_bes)))
    return e->tp ? ERR("out of memory") : -1;
  struct tp_setup_ctx c = {&e->p, e->tp_bes};
  if (tp_group_run(e->tp, tp_create_rank, &c))
    return -1;
  e->be = e->tp_bes[0];
  log_info("tensor parallelism: %d ranks, one thread and stream per %s device", e->p.tp, e->be->ops->name);
  return 0;
}

/* ---- Multi-process tensor parallelism (src/dist/mp.h): one process per rank ---- */

/* An integer environment variable NAME in [LO, HI] into *OUT when set and non-empty. */
static int env_int(const char *name, int lo, int hi, int *out) {
  const char *env = getenv(name);
  if (!env || !*env)
    return 0;
  char *end;
  long v = strtol(env, &end, 10);
  if (*end || v < lo || v > hi)
    return ERR("%s=%s: must be an integer %d .. %d", name, env, lo, hi);
  *out = (int)v;
  return 0;
}

/* --tp-rank / --tp-world / --tp-master, else $PAGODA_TP_RANK / _WORLD / _MASTER (after tp_resolve). */
static int mp_resolve(struct pagoda_engine_params *p) {
  if (p->tp_world < 0 || p->tp_world > 1024)
    return ERR("--tp-world %d: must be 1 .. 1024", p->tp_world);
  if (p->tp_world == 0) {
    p->tp_world = 1;
    if (env_int("PAGODA_TP_WORLD", 1, 1024, &p->tp_world))
      return -1;
  }
  if (p->tp_rank < 0) {
    p->tp_rank = 0;
    if (env_int("PAGODA_TP_RANK", 0, 1023, &p->tp_rank))
      return -1;
  }
  if (p->tp_rank >= p->tp_world)
    return ERR("--tp-rank %d: must be below --tp-world %d (ranks 0 .. %d; $PAGODA_TP_RANK / $PAGODA_TP_WORLD "
               "when the flags are not given)", p->tp_rank, p->tp_world, p->tp_world - 1);
  if (p->tp_world == 1)
    return 0;
  if (!p->tp_master || !*p->tp_master) {
    const char *env = getenv("PAGODA_TP_MASTER");
    if (!env || !*env)
      return ERR("--tp-world %d: give rank 0's address with --tp-master host:port (or $PAGODA_TP_MASTER)",
                 p->tp_world);
    p->tp_master = env;
  }
  if (p->tp > 1)
    return ERR("--tp %d with --tp-world %d: a multi-process group has one GPU per process; give one of them "
               "(unset $PAGODA_TP when the processes are started with --tp-world)", p->tp, p->tp_world);
  return 0;
}

/* The device of this process's rank: $LOCAL_RANK (as torchrun sets it) when set; else 0 when
 * $CUDA_VISIBLE_DEVICES names one GPU; else the rank (one host, one GPU per rank). */
static int mp_device_index(int rank) {
  int lr = -1;
  if (env_int("LOCAL_RANK", 0, 1023, &lr) == 0 && lr >= 0)
    return lr;
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (cvd && *cvd && !strchr(cvd, ','))
    return 0;
  return rank;
}

/* Seconds the rendezvous waits for every rank: $PAGODA_TP_TIMEOUT, else 300. */
static double mp_timeout(void) {
  int t = 300;
  if (env_int("PAGODA_TP_TIMEOUT", 1, 86400, &t))
    log_warn("%s; using 300 s", err_last());
  return (double)t;
}

/* This process's backend, place in the group and shard (rank P->tp_rank of P->tp_world): the
 * rendezvous first (the hash of the model's whole configuration, so a rank started with another
 * model, --isq or --tp-world is refused before anything loads), then the shard, then the
 * communicator. CUDA graphs are off (each worker runs its calls directly; docs/distributed.md). On
 * failure the caller frees what is set. */
static int mp_setup(const struct pagoda_engine_params *p, const char *path, struct backend **be, struct model **m,
                    struct tp_mp **mp, int *st) {
  struct backend_params bp = {p->device, p->threads, mp_device_index(p->tp_rank)};
  *st = PAGODA_ERR_BACKEND;
  if (!(*be = backend_create(&bp)))
    return -1;
  (*be)->caps.graphs = 0;
  *st = PAGODA_ERR_FORMAT;
  struct model_file *f = model_file_open(path);
  if (!f)
    return -1;
  uint64_t hash = tp_mp_config_hash(&f->config, p->isq, (*be)->ops->name, p->tp_world);
  model_file_close(f);
  *st = PAGODA_ERR_BACKEND;
  if (!(*mp = tp_mp_join(*be, p->tp_master, p->tp_rank, p->tp_world, hash, mp_timeout())))
    return -1;
  *m = model_load_rank(path, *be, p->isq, p->tp_rank, p->tp_world);
  if (tp_mp_start(*mp, *m)) {
    *st = *m ? PAGODA_ERR_BACKEND : PAGODA_ERR_FORMAT;
    return -1;
  }
  return 0;
}

/* No model given: PAGODA_MODEL when set and non-empty, else the default model, which must exist
 * (NULL with an error saying how to get it). */
static const char *resolve_model(void) {
  const char *env = getenv("PAGODA_MODEL");
  if (env && *env)
    return env;
  FILE *f = fopen(PAGODA_DEFAULT_MODEL, "rb");
  if (!f)
    return ERR("no model given (-m MODEL or PAGODA_MODEL) and the default model %s is missing: run "
               "scripts/setup.sh --model (or make run) to fetch SmolLM2-135M-Instruct Q4_1", PAGODA_DEFAULT_MODEL),
           NULL;
  fclose(f);
  return PAGODA_DEFAULT_MODEL;
}

int pagoda_engine_create(const struct pagoda_engine_params *params, pagoda_engine_t **out) {
  *out = NULL;
  struct pagoda_engine *e = calloc(1, sizeof *e);
  if (!e)
    return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
  e->p = *params;
  struct pagoda_engine_params *p = &e->p;
  int st = PAGODA_ERR_INVALID_ARG;
  if (sodium_init() < 0) {
    ERR("libsodium failed to initialize");
    goto fail;
  }
  if (!p->model && !(p->model = resolve_model())) {
    st = PAGODA_ERR_IO;
    goto fail;
  }
  if ((st = pagoda_resolve_model(p->model, p->revision, p->hf_file, &e->model_path)) != PAGODA_OK)
    goto fail;
  p->model = e->model_path;
  st = PAGODA_ERR_INVALID_ARG;
  if (p->block_size != 8 && p->block_size != 16 && p->block_size != 32) {
    ERR("--pa-block-size must be 8, 16 or 32 (got %d)", p->block_size);
    goto fail;
  }
  if (p->max_num_seqs < 1 || p->max_num_batched_tokens < 1 || p->prefill_chunk_size < 1 || p->prefix_cache_n < 0 ||
      p->max_model_len < 0 || p->threads < 0) {
    ERR("--max-num-seqs, --max-num-batched-tokens and --prefill-chunk-size must be positive; "
        "--prefix-cache-n, --max-model-len and --threads not negative");
    goto fail;
  }
  if (check_budget_flags(p))
    goto fail;
  if (tp_resolve(p) || mp_resolve(p))
    goto fail;
  if (p->tp_rank > 0) {
    ERR("--tp-rank %d: a rank > 0 runs rank 0's model calls (pagoda_tp_worker_run; the CLI does that for "
        "--tp-rank > 0), not an engine of its own", p->tp_rank);
    goto fail;
  }
  st = PAGODA_ERR_BACKEND;
  if (p->tp_world > 1) {
    if (mp_setup(p, p->model, &e->be, &e->model, &e->mp, &st))
      goto fail;
  } else if (p->tp > 1) {
    if (tp_setup(e))
      goto fail;
  } else {
    struct backend_params bp = {p->device, p->threads, 0};
    if (!(e->be = backend_create(&bp)))
      goto fail;
  }
  st = PAGODA_ERR_FORMAT;
  if (!e->model &&
      !(e->model = e->tp ? model_load_tp(p->model, e->tp_bes, e->tp, p->isq) : model_load_isq(p->model, e->be, p->isq)))
    goto fail;
  if (!(e->tok = tokenizer_load(p->model)))
    goto fail;
  const struct model_config *cfg = model_get_config(e->model);
  e->vocab = cfg->vocab_size;
  e->max_model_len = cfg->max_seq_len;
  st = PAGODA_ERR_INVALID_ARG;
  if (p->max_model_len > 0) {
    if (p->max_model_len > cfg->max_seq_len) {
      ERR("--max-model-len %d exceeds the model's context of %d tokens", p->max_model_len, cfg->max_seq_len);
      goto fail;
    }
    e->max_model_len = p->max_model_len;
  }
  e->block_size = p->block_size;
  e->max_blocks_per_seq = (e->max_model_len + e->block_size - 1) / e->block_size;
  enum dtype kv_dtype = DTYPE_F32;
  if (kv_dtype_for(p, e->be, &kv_dtype))
    goto fail;
  size_t block_bytes = model_kv_block_bytes(cfg, e->block_size, kv_dtype);
  /* Workspace first, then (on a device) one step at the largest batch, then the pool from what is
   * left: the pool never squeezes what a step needs (docs/kv-cache.md, Memory budget). */
  st = PAGODA_ERR_OUT_OF_MEMORY;
  if (model_alloc_workspace(e->model, p->max_num_batched_tokens, p->max_num_seqs, e->max_blocks_per_seq))
    goto fail;
  log_info("memory: weights %.1f MiB, step workspace %.1f MiB (%d tokens, %d sequences)",
           (double)model_weight_bytes(e->model) / 1048576.0, (double)model_workspace_bytes(e->model) / 1048576.0,
           p->max_num_batched_tokens, p->max_num_seqs);
  size_t avail = 0;
  const char *after = "the weights and the workspace";
  if (budget_from_free_memory(p)) {
    /* A backend that may allocate inside a step (lazy kernel loading, library handles) runs
     * one first, so that the pool is sized from what is left after it. */
    if (e->be->caps.needs_profile) {
      if (model_profile(e->model, e->block_size, kv_dtype)) {
        st = PAGODA_ERR_BACKEND;
        goto fail;
      }
      after = "the weights, the workspace and a profiling step";
    }
    avail = e->be->ops->mem_available(e->be);
  }
  st = PAGODA_ERR_INVALID_ARG;
  char why[256];
  int num_blocks = pool_blocks(e, block_bytes, avail, after, why, sizeof why);
  if (num_blocks < 0)
    goto fail;
  st = PAGODA_ERR_OUT_OF_MEMORY;
  if (model_alloc_kv(e->model, num_blocks, e->block_size, kv_dtype))
    goto fail;
  int paged = p->paged_attn != PAGODA_PAGED_ATTN_OFF;
  struct kv_manager_params kp = {num_blocks, e->block_size, e->max_blocks_per_seq, paged && p->prefix_cache_n > 0,
                                 !paged, p->prefix_cache_n};
  if (kv_manager_init(&e->kv, &kp))
    goto fail;
  kv_manager_set_window(&e->kv, model_kv_window(cfg));
  if (model_kv_window(cfg) > 0)
    log_info("sliding window: every layer attends to the last %d positions; a sequence's blocks wholly before "
             "its window go back to the pool (at most %d blocks per sequence once past it)",
             model_kv_window(cfg), model_kv_window(cfg) / e->block_size + 2);
  struct scheduler_params sp = {p->max_num_batched_tokens, p->max_num_seqs, p->prefill_chunk_size, e->max_model_len};
  if (scheduler_init(&e->sched, &sp, &e->kv) || alloc_batch(e))
    goto fail;
  e->num_samplers = p->threads > 0 ? p->threads : omp_get_max_threads();
  if (e->num_samplers < 1)
    e->num_samplers = 1;
  if (!(e->samplers = calloc((size_t)e->num_samplers, sizeof *e->samplers)))
    goto fail;
  for (int i = 0; i < e->num_samplers; i++)
    if (sampler_init(&e->samplers[i], e->vocab))
      goto fail;
  const char *ds = getenv("PAGODA_DEVICE_SAMPLING"); /* 0: host sampling on every backend */
  e->device_sampling = e->be->caps.device_sampling && e->be->ops->sample && e->be->ops->process &&
                       !(ds && !strcmp(ds, "0"));
  if (engine_async_init(e))
    goto fail;
  int tv = tokenizer_vocab_size(e->tok);
  if (tv > e->vocab)
    tv = e->vocab;
  e->eog = malloc((size_t)(tv > 0 ? tv : 1) * sizeof *e->eog);
  if (!e->eog)
    goto fail;
  for (int i = 0; i < tv; i++)
    if (tokenizer_is_eog(e->tok, i))
      e->eog[e->num_eog++] = i;
  log_info("KV pool: %d blocks of %d tokens (%.2f GiB = %.1f MiB, %s, %zu bytes per block), max %d tokens per "
           "sequence; sized by %s", num_blocks - 1, e->block_size, (double)block_bytes * num_blocks / 1073741824.0,
           (double)block_bytes * num_blocks / 1048576.0, dtype_name(kv_dtype), block_bytes, e->max_model_len, why);
  if (kv_dtype == DTYPE_F8E4M3)
    log_info("KV cache f8e4m3 (%s): 1 byte per value, twice the tokens of a bf16 cache in the same memory",
             model_has_kv_scales(e->model) ? "the checkpoint's per-layer k_scale / v_scale" : "per-layer scales 1.0");
  if (p->prefix_cache_n > 0 && paged)
    log_info("Prefix caching enabled (block-level, PagedAttention).");
  else if (p->prefix_cache_n > 0)
    log_info("Prefix caching enabled (sequence-level, contiguous cache: the last %d finished sequences).",
             p->prefix_cache_n);
  else
    log_info("Prefix caching disabled.");
  *out = e;
  return PAGODA_OK;
fail:
  pagoda_engine_free(e);
  return st;
}

void pagoda_engine_free(pagoda_engine_t *e) {
  if (!e)
    return;
  engine_async_free(e);
  for (struct request *r = e->live, *n; r; r = n) {
    n = r->next;
    for (int i = 0; i < r->num_seqs; i++)
      if (r->seqs[i].s.state != SCHED_NONE)
        scheduler_remove(&e->sched, &r->seqs[i].s);
    request_free(r);
  }
  for (struct request *r = e->dead, *n; r; r = n) {
    n = r->next;
    request_free(r);
  }
  scheduler_free(&e->sched);
  if (e->kv.pool.blocks)
    kv_manager_free(&e->kv);
  for (int i = 0; e->samplers && i < e->num_samplers; i++)
    sampler_free(&e->samplers[i]);
  free(e->samplers);
  free(e->picked);
  free(e->dev_params);
  free(e->dev_tokens);
  free(e->lp_target);
  free(e->lp_value);
  free(e->proc);
  free(e->proc_bias);
  free(e->ds_mem);
  free(e->input_ids);
  free(e->positions);
  free(e->slots);
  free(e->query_start);
  free(e->seq_lens);
  free(e->block_tables);
  free(e->logits_idx);
  free(e->lp_row0);
  free(e->lp_pos0);
  free(e->lp_num_rows);
  free(e->logit_row);
  free(e->logits);
  free(e->copy_src);
  free(e->copy_dst);
  free(e->eog);
  free(e->dirty);
  free(e->outs);
  if (e->tok)
    tokenizer_free(e->tok);
  tp_mp_stop(e->mp); /* the workers quit before the model goes */
  if (e->model)
    model_free(e->model);
  if (e->tp) {
    if (e->tp_bes)
      tp_group_run(e->tp, tp_destroy_rank, e->tp_bes);
    tp_group_destroy(e->tp);
    free(e->tp_bes);
  } else if (e->be) {
    e->be->ops->destroy(e->be);
  }
  tp_mp_free(e->mp); /* after the backend, which borrowed its sockets */
  free(e->model_path);
  free(e);
}

int pagoda_tp_rank(const struct pagoda_engine_params *params) {
  struct pagoda_engine_params p = *params;
  if (tp_resolve(&p) || mp_resolve(&p))
    return -1;
  return p.tp_rank;
}

int pagoda_tp_worker_run(const struct pagoda_engine_params *params) {
  struct pagoda_engine_params p = *params;
  char *path = NULL;
  struct backend *be = NULL;
  struct model *m = NULL;
  struct tp_mp *mp = NULL;
  int st = PAGODA_ERR_INVALID_ARG;
  if (tp_resolve(&p) || mp_resolve(&p))
    goto done;
  if (p.tp_rank < 1) {
    ERR("pagoda_tp_worker_run: this process is rank %d of %d; only a rank > 0 of a multi-process group "
        "(--tp-world > 1) runs the worker", p.tp_rank, p.tp_world);
    goto done;
  }
  if (!p.model && !(p.model = resolve_model())) {
    st = PAGODA_ERR_IO;
    goto done;
  }
  if ((st = pagoda_resolve_model(p.model, p.revision, p.hf_file, &path)) != PAGODA_OK)
    goto done;
  if (mp_setup(&p, path, &be, &m, &mp, &st))
    goto done;
  st = tp_mp_worker_loop(mp) ? PAGODA_ERR_BACKEND : PAGODA_OK;
  if (st == PAGODA_OK)
    log_info("tensor-parallel rank %d: rank 0 finished; exiting", p.tp_rank);
done:;
  char why[1024];
  snprintf(why, sizeof why, "%s", err_last());
  tp_mp_stop(mp); /* the watchdog uses the backend: it stops first */
  if (m)
    model_free(m);
  if (be)
    be->ops->destroy(be);
  tp_mp_free(mp);
  free(path);
  if (st != PAGODA_OK)
    ERR("%s", why);
  return st;
}
