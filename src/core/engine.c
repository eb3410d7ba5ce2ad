/* engine.c - the engine behind include/pagoda.h: owns model, tokenizer, KV manager, scheduler and
 * sampler; each step schedules, runs one flattened batch and turns logits into outputs.
 *
 * Threading: one thread owns an engine (no locks inside). Requests and aborts are applied between
 * steps; a front end with other threads hands them over through its own queue. Memory: the pool,
 * the batch arrays and the logits are allocated once at creation; a request allocates its
 * sequences (tokens, tables) when added; nothing is allocated per token apart from the amortized
 * growth of a sequence's output text. */
#include <math.h>
#include <omp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/beam.h"
#include "core/kv_manager.h"
#include "core/request.h"
#include "core/scheduler.h"
#include "model/model.h"
#include "pagoda.h"
#include "sampling/sampler.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/log.h"

struct pagoda_engine {
  struct pagoda_engine_params p; /* p.model: the resolved local path (model_path) */
  char *model_path;              /* pagoda_resolve_model's answer for the model given */
  struct backend *be;
  struct model *model;
  struct tokenizer *tok;
  int vocab, max_model_len, block_size, max_blocks_per_seq;
  struct kv_manager kv;
  struct scheduler sched;
  struct sampler *samplers; /* (n_samplers) one scratch per OpenMP thread of the sampling loop */
  int n_samplers;
  int32_t *picked;         /* (max_num_seqs) token sampled for each scheduled item, -1: later */
  int32_t *eog;            /* (n_eog) ids that end generation (EOS, end of turn) */
  int n_eog;
  /* The step's batch in host memory (the model copies it to its device). */
  int32_t *input_ids;      /* (max_num_batched_tokens) */
  int32_t *positions;      /* (max_num_batched_tokens) */
  int32_t *slots;          /* (max_num_batched_tokens) */
  int32_t *query_start;    /* (max_num_seqs + 1) */
  int32_t *seq_lens;       /* (max_num_seqs) */
  int32_t *block_tables;   /* (max_num_seqs, max_blocks_per_seq); row stride is per step */
  int32_t *logits_idx;     /* (max_num_seqs) */
  int32_t *logit_row;      /* (max_num_seqs) logits row of each scheduled item, -1: none */
  float *logits;           /* (logits_cap, vocab): max_num_seqs rows, more while prompt logprobs run */
  int logits_cap;
  /* Prompt logprobs of scheduled item b: rows [lp_row0[b], + lp_n[b]) score prompt positions
   * lp_pos0[b].. (each row predicts the next prompt token). */
  int32_t *lp_row0, *lp_pos0, *lp_n; /* (max_num_seqs) */
  int32_t *copy_src, *copy_dst; /* (max_num_seqs) */
  struct request *live;    /* doubly linked list of unfinished (or unreported) requests */
  struct request *dead;    /* reported finished: freed at the start of the next step */
  uint64_t next_id;
  struct sequence **dirty; /* (dirty_cap) sequences with something to report */
  int n_dirty, dirty_cap;
  struct pagoda_output *outs; /* (dirty_cap) */
  /* stats */
  double waste_slots, alloc_slots, peak_usage;
  int64_t steps, prompt_computed, generated;
};

void pagoda_engine_params_default(struct pagoda_engine_params *p) {
  memset(p, 0, sizeof *p);
  p->block_size = 32;
  p->prefix_cache_n = 16;
  p->max_num_seqs = 256;
  p->max_num_batched_tokens = 8192;
  p->prefill_chunk_size = 4096;
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
  e->lp_n = malloc((size_t)B * 4);
  e->logits_cap = B;
  e->logit_row = malloc((size_t)B * 4);
  e->logits = malloc((size_t)B * e->vocab * sizeof(float));
  e->copy_src = malloc((size_t)B * 4);
  e->copy_dst = malloc((size_t)B * 4);
  e->picked = malloc((size_t)B * 4);
  if (!e->picked ||!e->input_ids || !e->positions || !e->slots || !e->query_start || !e->seq_lens || !e->block_tables ||
      !e->logits_idx || !e->logit_row || !e->logits || !e->copy_src || !e->copy_dst || !e->lp_row0 || !e->lp_pos0 || !e->lp_n)
    return ERR("out of memory for the step buffers (lower --max-num-batched-tokens or --max-num-seqs)");
  return 0;
}

/* The KV dtype for --pa-cache-type. auto: a GGUF model on the CPU gets f16, the cache llama.cpp
 * runs GGUF models with (its greedy outputs are the reference users compare with; half the
 * memory); otherwise the compute dtype (f32 on CPU, bf16 on CUDA), as vLLM's auto. */
static int kv_dtype_for(const struct pagoda_engine_params *p, const struct backend *be, enum dtype *out) {
  int cpu = be->act_dtype == DTYPE_F32;
  size_t n = strlen(p->model);
  int gguf = n >= 5 && strcmp(p->model + n - 5, ".gguf") == 0;
  switch (p->cache_type) {
  case PAGODA_CACHE_TYPE_AUTO: *out = cpu && gguf ? DTYPE_F16 : be->act_dtype; break;
  case PAGODA_CACHE_TYPE_F32: *out = DTYPE_F32; break;
  case PAGODA_CACHE_TYPE_F16: *out = DTYPE_F16; break;
  case PAGODA_CACHE_TYPE_BF16: *out = DTYPE_BF16; break;
  case PAGODA_CACHE_TYPE_F8E4M3: *out = DTYPE_F8E4M3; break;
  default: return ERR("--pa-cache-type: unknown value %d", (int)p->cache_type);
  }
  if (*out != be->act_dtype && *out != DTYPE_F8E4M3 && !(cpu && *out == DTYPE_F16))
    return ERR("--pa-cache-type %s is not supported by the %s backend (it keeps the KV cache in %s%s or "
               "f8e4m3); use --pa-cache-type auto", dtype_name(*out), be->ops->name, dtype_name(be->act_dtype),
               cpu ? ", f16" : "");
  return 0;
}

const char *pagoda_default_model(void) { return PAGODA_DEFAULT_MODEL; }

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
  struct backend_params bp = {p->device, p->threads};
  st = PAGODA_ERR_BACKEND;
  if (!(e->be = backend_create(&bp)))
    goto fail;
  st = PAGODA_ERR_FORMAT;
  if (!(e->model = model_load_isq(p->model, e->be, p->isq)))
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
    /* The CPU backend allocates nothing inside a step (its workspace was zeroed, so its pages
     * already count against MemAvailable); a device may (lazy kernel loading, library handles). */
    if (strcmp(e->be->ops->name, "cpu") != 0) {
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
  struct scheduler_params sp = {p->max_num_batched_tokens, p->max_num_seqs, p->prefill_chunk_size, e->max_model_len};
  if (scheduler_init(&e->sched, &sp, &e->kv) || alloc_batch(e))
    goto fail;
  e->n_samplers = p->threads > 0 ? p->threads : omp_get_max_threads();
  if (e->n_samplers < 1)
    e->n_samplers = 1;
  if (!(e->samplers = calloc((size_t)e->n_samplers, sizeof *e->samplers)))
    goto fail;
  for (int i = 0; i < e->n_samplers; i++)
    if (sampler_init(&e->samplers[i], e->vocab))
      goto fail;
  int tv = tokenizer_vocab_size(e->tok);
  if (tv > e->vocab)
    tv = e->vocab;
  e->eog = malloc((size_t)(tv > 0 ? tv : 1) * sizeof *e->eog);
  if (!e->eog)
    goto fail;
  for (int i = 0; i < tv; i++)
    if (tokenizer_is_eog(e->tok, i))
      e->eog[e->n_eog++] = i;
  log_info("KV pool: %d blocks of %d tokens (%.2f GiB = %.1f MiB, %s, %zu bytes per block), max %d tokens per "
           "sequence; sized by %s", num_blocks - 1, e->block_size, (double)block_bytes * num_blocks / 1073741824.0,
           (double)block_bytes * num_blocks / 1048576.0, dtype_name(kv_dtype), block_bytes, e->max_model_len, why);
  if (kv_dtype == DTYPE_F8E4M3)
    log_info("KV cache f8e4m3 (per-layer scales 1.0): 1 byte per value, twice the tokens of a bf16 cache in the "
             "same memory");
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
  for (struct request *r = e->live, *n; r; r = n) {
    n = r->next;
    for (int i = 0; i < r->n_seqs; i++)
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
  for (int i = 0; e->samplers && i < e->n_samplers; i++)
    sampler_free(&e->samplers[i]);
  free(e->samplers);
  free(e->picked);
  free(e->input_ids);
  free(e->positions);
  free(e->slots);
  free(e->query_start);
  free(e->seq_lens);
  free(e->block_tables);
  free(e->logits_idx);
  free(e->lp_row0);
  free(e->lp_pos0);
  free(e->lp_n);
  free(e->logit_row);
  free(e->logits);
  free(e->copy_src);
  free(e->copy_dst);
  free(e->eog);
  free(e->dirty);
  free(e->outs);
  if (e->tok)
    tokenizer_free(e->tok);
  if (e->model)
    model_free(e->model);
  if (e->be)
    e->be->ops->destroy(e->be);
  free(e->model_path);
  free(e);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int validate(const struct pagoda_engine *e, const int32_t *ids, int n, const struct pagoda_sampling_params *sp) {
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= e->vocab)
      return ERR("token id %d at position %d is outside the vocabulary [0, %d)", ids[i], i, e->vocab);
  if (sp->n < 1 || sp->n > 1024)
    return ERR("n must be in [1, 1024] (got %d)", sp->n);
  if (!(sp->temperature >= 0) || !(sp->top_p > 0 && sp->top_p <= 1) || !(sp->min_p >= 0 && sp->min_p <= 1))
    return ERR("temperature must be >= 0, top_p in (0, 1], min_p in [0, 1]");
  if (!(sp->repetition_penalty > 0) || !isfinite(sp->presence_penalty) || !isfinite(sp->frequency_penalty))
    return ERR("repetition_penalty must be > 0; presence and frequency penalties finite");
  if (sp->max_tokens == 0 || sp->max_tokens < -1 || sp->min_tokens < 0)
    return ERR("max_tokens must be >= 1 (or -1 for no limit), min_tokens >= 0");
  if (sp->beam_width < 0 || sp->beam_width > 64)
    return ERR("beam_width must be in [0, 64]");
  if (sp->beam_width > 1 && !(sp->length_penalty == sp->length_penalty))
    return ERR("length_penalty must be a number");
  if (sp->n_stop < 0 || sp->n_stop_token_ids < 0 || sp->n_logit_bias < 0 || (sp->n_stop && !sp->stop))
    return ERR("bad stop or logit_bias arrays");
  for (int i = 0; i < sp->n_stop; i++)
    if (!sp->stop[i])
      return ERR("stop string %d is NULL", i);
  for (int i = 0; i < sp->n_stop_token_ids; i++)
    if (sp->stop_token_ids[i] < 0 || sp->stop_token_ids[i] >= e->vocab)
      return ERR("stop token id %d outside the vocabulary", sp->stop_token_ids[i]);
  for (int i = 0; i < sp->n_logit_bias; i++)
    if (sp->logit_bias_ids[i] < 0 || sp->logit_bias_ids[i] >= e->vocab || !isfinite(sp->logit_bias_values[i]))
      return ERR("logit_bias entry %d: token id %d outside the vocabulary or value not finite", i,
                 sp->logit_bias_ids[i]);
  if (sp->top_logprobs < 0 || sp->top_logprobs > 20 || (sp->top_logprobs > 0 && !sp->logprobs))
    return ERR("top_logprobs must be in [0, 20] and needs logprobs");
  if (sp->logprobs && sp->beam_width > 1)
    return ERR("logprobs are not available with beam search");
  return 0;
}

int pagoda_add_request_tokens(pagoda_engine_t *e, const int32_t *ids, int n, const struct pagoda_sampling_params *spp,
                              uint64_t *id) {
  struct pagoda_sampling_params sp;
  if (spp)
    sp = *spp;
  else
    pagoda_sampling_params_default(&sp);
  if (!ids || n < 1)
    return ERR("the prompt is empty"), PAGODA_ERR_INVALID_ARG;
  if (validate(e, ids, n, &sp))
    return PAGODA_ERR_INVALID_ARG;
  if (sp.prompt_logprobs && sp.beam_width > 1)
    return ERR("prompt_logprobs cannot be combined with beam search"), PAGODA_ERR_INVALID_ARG;
  if (sp.beam_width > 1 && !kv_manager_can_fork(&e->kv))
    return ERR("beam search needs the paged KV cache (it shares blocks between beams): drop --paged-attn off"),
           PAGODA_ERR_UNSUPPORTED;
  int max_tokens = sp.max_tokens > 0 ? sp.max_tokens : e->max_model_len - n;
  if (max_tokens < 1)
    max_tokens = 1; /* admission below reports the prompt as too long */
  if (scheduler_check_admission(&e->sched, n, max_tokens))
    return PAGODA_ERR_TOO_LONG;
  if (sp.beam_width > 1) { /* beams can diverge at once: W whole sequences must fit together */
    long blocks = (long)sp.beam_width * ((n + max_tokens + e->block_size - 1) / e->block_size);
    if (blocks > kv_manager_capacity(&e->kv))
      return ERR("beam search with %d beams over %d + %d tokens may need %ld KV blocks but the pool has %d: "
                 "raise --pa-memory-mb or lower max_tokens", sp.beam_width, n, max_tokens, blocks,
                 kv_manager_capacity(&e->kv)), PAGODA_ERR_TOO_LONG;
  }
  if (sp.seed < 0) {
    uint64_t s;
    randombytes_buf(&s, sizeof s);
    sp.seed = (int64_t)(s >> 1);
  }
  int n_new = sp.beam_width > 1 ? sp.beam_width : sp.n;
  int need = e->n_dirty + n_new + 1; /* outputs a step can report are bounded by live sequences */
  int live_seqs = 0;
  for (struct request *r = e->live; r; r = r->next)
    live_seqs += r->n_seqs;
  if (need < live_seqs + n_new)
    need = live_seqs + n_new;
  if (need > e->dirty_cap) {
    int cap = e->dirty_cap ? e->dirty_cap : 64;
    while (cap < need)
      cap *= 2;
    struct sequence **d = realloc(e->dirty, (size_t)cap * sizeof *d);
    if (d)
      e->dirty = d;
    struct pagoda_output *o = realloc(e->outs, (size_t)cap * sizeof *o);
    if (o)
      e->outs = o;
    if (!d || !o)
      return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
    e->dirty_cap = cap;
  }
  struct request *r = request_create(e->next_id + 1, ids, n, max_tokens, &sp, &e->kv, e->tok, e->eog, e->n_eog);
  if (!r)
    return PAGODA_ERR_OUT_OF_MEMORY;
  r->t_arrival = now_s();
  r->seqs[0].started = 1;
  r->seqs[0].s.no_prefix_hit = r->prompt_lp != NULL;
  scheduler_add(&e->sched, &r->seqs[0].s);
  r->next = e->live;
  if (e->live)
    e->live->prev = r;
  e->live = r;
  *id = ++e->next_id;
  return PAGODA_OK;
}

int pagoda_add_request(pagoda_engine_t *e, const char *text, const struct pagoda_sampling_params *sp, uint64_t *id) {
  if (!text)
    return ERR("no prompt text"), PAGODA_ERR_INVALID_ARG;
  size_t len = strlen(text);
  int32_t small[512];
  int n = tokenizer_encode(e->tok, text, len, 1, 0, small, 512);
  if (n < 0)
    return PAGODA_ERR_INVALID_ARG;
  if (n <= 512)
    return pagoda_add_request_tokens(e, small, n, sp, id);
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  if (!ids)
    return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
  int rc = tokenizer_encode(e->tok, text, len, 1, 0, ids, n) == n ? pagoda_add_request_tokens(e, ids, n, sp, id)
                                                                  : PAGODA_ERR_INVALID_ARG;
  free(ids);
  return rc;
}

static void mark_dirty(struct pagoda_engine *e, struct sequence *s) {
  if (!s->dirty) {
    s->dirty = 1;
    e->dirty[e->n_dirty++] = s;
  }
}

/* SEQ ended (finish set): leaves the scheduler, its blocks go back to the pool. */
static void finish_seq(struct pagoda_engine *e, struct sequence *s) {
  if (s->s.state != SCHED_NONE)
    scheduler_remove(&e->sched, &s->s);
  s->req->n_live--;
  mark_dirty(e, s);
}

int pagoda_abort(pagoda_engine_t *e, uint64_t id) {
  for (struct request *r = e->live; r; r = r->next) {
    if (r->id != id || r->n_live == 0)
      continue;
    for (int i = 0; i < r->n_seqs; i++) {
      struct sequence *s = &r->seqs[i];
      if (s->finish)
        continue;
      s->finish = PAGODA_FINISH_ABORT;
      finish_seq(e, s);
    }
    return PAGODA_OK;
  }
  return ERR("no running request with id %llu", (unsigned long long)id), PAGODA_ERR_NOT_FOUND;
}

int pagoda_engine_has_work(const pagoda_engine_t *e) { return scheduler_has_work(&e->sched) || e->n_dirty > 0; }

/* Samples 1..n-1 of SEQ's request start from SEQ's state after the prompt: they share its blocks
 * (ref counts) and each draws its first token from the same logits with its own generator. */
static int fork_samples(struct pagoda_engine *e, struct sequence *seq, const float *logits,
                        const struct sampler_params *sp) {
  struct request *r = seq->req;
  struct sched_seq *after = &seq->s;
  for (int i = 1; i < r->n_seqs; i++) {
    struct sequence *c = &r->seqs[i];
    c->started = 1;
    c->s.num_cached_prompt = seq->s.num_cached_prompt;
    if (kv_manager_can_fork(&e->kv)) {
      kv_manager_fork(&e->kv, &seq->s.kv, &c->s.kv);
      c->s.num_computed = seq->s.num_computed;
      scheduler_add_running(&e->sched, &c->s, after);
      after = &c->s;
    } else { /* contiguous cache: no sharing; the sample computes its own copy of the prompt */
      c->s.admitted = 1;
      scheduler_add(&e->sched, &c->s);
    }
    int32_t tok = sampler_pick(&e->samplers[0], sp, logits, &c->rng);
    if (sequence_push_token(c, tok, e->tok, e->max_model_len))
      return -1;
    sequence_record_logprob(c, seq, e->vocab);
    e->generated++;
    mark_dirty(e, c);
    if (c->finish)
      finish_seq(e, c);
  }
  return 0;
}

static void account_waste(struct pagoda_engine *e) {
  const struct kv_manager *kv = &e->kv;
  int used = kv_manager_capacity(kv) - kv_manager_num_free(kv);
  double usage = (double)used / kv_manager_capacity(kv);
  if (usage > e->peak_usage)
    e->peak_usage = usage;
  double waste = 0;
  if (kv->p.contiguous) { /* every reserved slot of a region not holding a token is waste */
    waste = (double)used * e->block_size;
    for (const struct sched_seq *s = e->sched.running.head; s; s = s->next)
      waste -= s->kv.num_tokens;
  }
  for (const struct sched_seq *s = e->sched.running.head; s && !kv->p.contiguous; s = s->next) {
    int empty = s->kv.num_blocks * e->block_size - s->kv.num_tokens;
    if (empty > 0) /* a partial block shared by forks is counted once over its holders */
      waste += (double)empty / kv->pool.blocks[s->kv.blocks[s->kv.num_blocks - 1]].ref_count;
  }
  e->waste_slots += waste;
  e->alloc_slots += (double)used * e->block_size;
}

static int run_batch(struct pagoda_engine *e, const struct scheduler_output *o) {
  for (int i = 0; i < o->num_copies; i++) {
    e->copy_src[i] = o->copies[i].src;
    e->copy_dst[i] = o->copies[i].dst;
  }
  if (o->num_copies && model_copy_blocks(e->model, e->copy_src, e->copy_dst, o->num_copies))
    return -1;
  int bs = e->block_size, t = 0, nl = 0, stride = 1, max_q = 0, max_len = 0;
  for (int b = 0; b < o->num_items; b++)
    if (o->items[b].seq->kv.num_blocks > stride)
      stride = o->items[b].seq->kv.num_blocks;
  for (int b = 0; b < o->num_items; b++) {
    const struct sched_seq *s = o->items[b].seq;
    int n = o->items[b].num_new, start = s->num_computed;
    e->query_start[b] = t;
    for (int j = 0; j < n; j++, t++) {
      int pos = start + j;
      e->input_ids[t] = s->tokens[pos];
      e->positions[t] = pos;
      e->slots[t] = s->kv.blocks[pos / bs] * bs + pos % bs;
    }
    if (start < s->num_prompt)
      e->prompt_computed += (start + n < s->num_prompt ? start + n : s->num_prompt) - start;
    e->seq_lens[b] = start + n;
    int32_t *row = e->block_tables + (size_t)b * stride;
    memcpy(row, s->kv.blocks, (size_t)s->kv.num_blocks * sizeof *row);
    for (int j = s->kv.num_blocks; j < stride; j++)
      row[j] = 0;
    e->logit_row[b] = -1;
    if (start + n == s->num_tokens) {
      e->logit_row[b] = nl;
      e->logits_idx[nl++] = t - 1;
    }
    max_q = n > max_q ? n : max_q;
    max_len = start + n > max_len ? start + n : max_len;
  }
  e->query_start[o->num_items] = t;
  for (int b = 0; b < o->num_items; b++) { /* prompt positions whose next token is scored */
    const struct sched_seq *s = o->items[b].seq;
    int start = s->num_computed, end = start + o->items[b].num_new;
    if (end > s->num_prompt - 1)
      end = s->num_prompt - 1;
    e->lp_n[b] = 0;
    if (!((const struct sequence *)s)->req->prompt_lp || end <= start)
      continue;
    e->lp_row0[b] = nl;
    e->lp_pos0[b] = start;
    e->lp_n[b] = end - start;
    for (int j = start; j < end; j++)
      e->logits_idx[nl++] = e->query_start[b] + (j - start);
  }
  if (nl > e->logits_cap) { /* grows only while prompt logprobs are asked for */
    float *g = realloc(e->logits, (size_t)nl * e->vocab * sizeof(float));
    if (!g)
      return ERR("out of memory for %d rows of prompt logprobs (lower --max-num-batched-tokens)", nl);
    e->logits = g;
    e->logits_cap = nl;
  }
  struct batch batch = {
      .num_tokens = t, .num_seqs = o->num_items, .max_blocks_per_seq = stride, .max_seq_len = max_len,
      .max_query_len = max_q, .input_ids = e->input_ids, .positions = e->positions, .slot_mapping = e->slots,
      .query_start = e->query_start, .seq_lens = e->seq_lens, .block_tables = e->block_tables,
      .num_logits = nl, .logits_idx = e->logits_idx};
  return model_forward(e->model, &batch, e->logits);
}

/* log softmax of each prompt-logprob row at its next prompt token, into the request's array;
 * before scheduler_update (num_computed is still the chunk start). */
static void prompt_logprobs(struct pagoda_engine *e, const struct scheduler_output *o) {
  for (int b = 0; b < o->num_items; b++) {
    if (!e->lp_n[b])
      continue;
    const struct sequence *s = (const struct sequence *)o->items[b].seq;
    struct request *r = s->req;
    int n = e->lp_n[b], pos0 = e->lp_pos0[b], row0 = e->lp_row0[b], V = e->vocab;
#pragma omp parallel for schedule(static) if (n > 1)
    for (int j = 0; j < n; j++) {
      const float *lg = e->logits + (size_t)(row0 + j) * V;
      float mx = lg[0];
      for (int v = 1; v < V; v++)
        mx = lg[v] > mx ? lg[v] : mx;
      double sum = 0;
      for (int v = 0; v < V; v++)
        sum += exp((double)lg[v] - mx);
      r->prompt_lp[pos0 + j] = (float)((double)lg[s->s.tokens[pos0 + j + 1]] - mx - log(sum));
    }
    if (pos0 + n == r->num_prompt - 1)
      r->prompt_lp_done = 1;
  }
}

static void collect_outputs(struct pagoda_engine *e, int *n_outs) {
  int n = 0;
  for (int i = 0; i < e->n_dirty; i++) {
    struct sequence *s = e->dirty[i];
    struct request *r = s->req;
    struct pagoda_output *o = &e->outs[n++];
    int n_out = sequence_num_output(s);
    size_t end = sequence_reportable_text(s);
    o->request_id = r->id;
    o->index = s->index;
    o->token_ids = s->tokens + s->s.num_prompt + s->tokens_sent;
    o->num_token_ids = n_out - s->tokens_sent;
    o->text = s->text ? s->text + s->text_sent : "";
    o->text_len = end - s->text_sent;
    o->finish_reason = s->finish;
    o->usage.prompt_tokens = r->num_prompt;
    o->usage.completion_tokens = 0;
    for (int k = 0; k < r->n_seqs; k++)
      o->usage.completion_tokens += sequence_num_output(&r->seqs[k]);
    o->usage.cached_prompt_tokens = r->seqs[0].s.num_cached_prompt;
    o->prompt_logprobs = NULL;
    o->num_prompt_logprobs = 0;
    if (s->index == 0 && r->prompt_lp && r->prompt_lp_done && !r->prompt_lp_sent) {
      o->prompt_logprobs = r->prompt_lp;
      o->num_prompt_logprobs = r->num_prompt - 1;
      r->prompt_lp_sent = 1;
    }
    o->logprobs = NULL;
    o->top_logprob_ids = NULL;
    o->top_logprobs = NULL;
    o->num_top_logprobs = 0;
    if (r->sp.logprobs && s->lp) {
      o->num_top_logprobs = r->sp.top_logprobs;
      o->logprobs = s->lp + s->tokens_sent;
      o->top_logprob_ids = s->top_ids + (size_t)s->tokens_sent * (size_t)o->num_top_logprobs;
      o->top_logprobs = s->top_lp + (size_t)s->tokens_sent * (size_t)o->num_top_logprobs;
    }
    s->tokens_sent = n_out;
    s->text_sent = end;
    s->dirty = 0;
  }
  e->n_dirty = 0;
  *n_outs = n;
  /* Requests whose every sequence finished and was reported move to the dead list. */
  for (struct request *r = e->live, *next; r; r = next) {
    next = r->next;
    if (r->n_live > 0)
      continue;
    int pending = 0;
    for (int k = 0; k < r->n_seqs; k++)
      pending |= r->seqs[k].dirty;
    if (pending)
      continue;
    if (r->prev)
      r->prev->next = r->next;
    else
      e->live = r->next;
    if (r->next)
      r->next->prev = r->prev;
    r->prev = NULL;
    r->next = e->dead;
    e->dead = r;
  }
  if (e->p.on_output)
    for (int i = 0; i < n; i++)
      e->p.on_output(&e->outs[i], e->p.user);
}

int pagoda_engine_step(pagoda_engine_t *e, const struct pagoda_output **outs, int *n_outs) {
  *outs = e->outs;
  *n_outs = 0;
  for (struct request *r = e->dead, *n; r; r = n) { /* their outputs were read last step */
    n = r->next;
    request_free(r);
  }
  e->dead = NULL;
  const struct scheduler_output *o;
  if (scheduler_schedule(&e->sched, &o))
    return PAGODA_ERR_OUT_OF_MEMORY;
  if (o->num_items) {
    if (run_batch(e, o)) {
      /* The device failed this batch: its requests end (reported as aborted, blocks freed) and
       * the engine keeps serving the others. */
      log_error("forward pass failed: %s", err_last_where());
      for (int b = 0; b < o->num_items; b++) {
        struct request *r = ((struct sequence *)o->items[b].seq)->req;
        for (int k = 0; k < r->n_seqs; k++)
          if (!r->seqs[k].finish) {
            r->seqs[k].finish = PAGODA_FINISH_ABORT;
            finish_seq(e, &r->seqs[k]);
          }
      }
      collect_outputs(e, n_outs);
      return PAGODA_ERR_BACKEND;
    }
    e->steps++;
    prompt_logprobs(e, o);
    scheduler_update(&e->sched);
    /* Phase 1, in parallel over sequences (each has its own logits row and generator; each
     * thread its own scratch): processors, then the token for plain samples. Forks and beams
     * touch shared state and are finished in phase 2. */
    int nl = 0;
    for (int b = 0; b < o->num_items; b++)
      nl += e->logit_row[b] >= 0;
    int nt = (long)nl * e->vocab >= (1L << 17) ? e->n_samplers : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int b = 0; b < o->num_items; b++) {
      e->picked[b] = -1;
      if (e->logit_row[b] < 0)
        continue;
      struct sequence *s = (struct sequence *)o->items[b].seq;
      struct sampler *smp = &e->samplers[omp_get_thread_num()];
      float *lg = e->logits + (size_t)e->logit_row[b] * e->vocab;
      struct sampler_params sp;
      sequence_sampler_params(s, &sp);
      if (s->req->sp.logprobs && sequence_save_raw(s, lg, e->vocab))
        e->picked[b] = -2; /* out of memory: reported in phase 2 */
      sampler_apply_processors(smp, &sp, lg, s->tokens, s->s.num_prompt, s->tokens + s->s.num_prompt,
                               sequence_num_output(s));
      int forks = s->index == 0 && s->req->n_seqs > 1 && !s->req->seqs[1].started;
      if (!s->req->beam && !forks && e->picked[b] == -1)
        e->picked[b] = sampler_pick(smp, &sp, lg, &s->rng);
    }
    /* Phase 2, in batch order: tokens, forks, beams, stop conditions. */
    for (int b = 0; b < o->num_items; b++) {
      if (e->logit_row[b] < 0)
        continue;
      if (e->picked[b] == -2)
        return PAGODA_ERR_OUT_OF_MEMORY;
      struct sequence *s = (struct sequence *)o->items[b].seq;
      float *lg = e->logits + (size_t)e->logit_row[b] * e->vocab;
      struct sampler_params spv;
      sequence_sampler_params(s, &spv);
      const struct sampler_params *sp = &spv;
      if (s->req->beam) { /* beams report once, at the end, in rank order */
        struct beam_env env = {&e->sched, &e->kv, e->tok, e->vocab, e->max_model_len};
        int rc = beam_on_logits(&env, s, lg);
        if (rc < 0)
          return PAGODA_ERR_OUT_OF_MEMORY;
        e->generated++;
        for (int k = 0; rc == 1 && k < s->req->n_seqs; k++)
          mark_dirty(e, &s->req->seqs[k]);
        continue;
      }
      if (s->index == 0 && s->req->n_seqs > 1 && !s->req->seqs[1].started &&
          fork_samples(e, s, lg, sp))
        return PAGODA_ERR_OUT_OF_MEMORY;
      int32_t tok = e->picked[b] >= 0 ? e->picked[b] : sampler_pick(&e->samplers[0], sp, lg, &s->rng);
      if (sequence_push_token(s, tok, e->tok, e->max_model_len))
        return PAGODA_ERR_OUT_OF_MEMORY;
      sequence_record_logprob(s, s, e->vocab);
      e->generated++;
      mark_dirty(e, s);
      if (s->finish)
        finish_seq(e, s);
    }
    account_waste(e);
  } else if (scheduler_has_work(&e->sched) && e->n_dirty == 0 && o->num_preempted == 0) {
    /* Nothing runnable and nothing to report: only possible when the sequences holding blocks
     * wait for one that cannot get any (beams of one request on a pool too small for them). */
    return ERR("no request can make progress: the KV pool is too small for the running requests "
               "(raise --pa-memory-mb)"), PAGODA_ERR_OUT_OF_MEMORY;
  }
  collect_outputs(e, n_outs);
  return PAGODA_OK;
}

int pagoda_engine_stats(const pagoda_engine_t *e, struct pagoda_engine_stats *s) {
  memset(s, 0, sizeof *s);
  const struct kv_manager *kv = &e->kv;
  s->num_blocks = kv_manager_capacity(kv);
  s->block_size = e->block_size;
  s->free_blocks = kv_manager_num_free(kv);
  s->running = e->sched.running.count;
  s->waiting = e->sched.waiting.count;
  s->kv_usage = (double)(s->num_blocks - s->free_blocks) / s->num_blocks;
  s->kv_peak_usage = e->peak_usage;
  s->kv_waste_fraction = e->alloc_slots > 0 ? e->waste_slots / e->alloc_slots : 0;
  if (kv->p.enable_prefix_cache || kv->p.contiguous) {
    s->prefix_queries = kv->cache.stats.queries;
    s->prefix_hits = kv->cache.stats.hits;
    s->prefix_evictions = kv->cache.stats.evictions;
  }
  s->preemptions = e->sched.total_preemptions;
  s->steps = e->steps;
  s->prompt_tokens_computed = e->prompt_computed;
  s->generated_tokens = e->generated;
  s->paged = !kv->p.contiguous;
  return PAGODA_OK;
}

int pagoda_max_model_len(const pagoda_engine_t *e) { return e->max_model_len; }
int pagoda_vocab_size(const pagoda_engine_t *e) { return e->vocab; }

int pagoda_tokenize(const pagoda_engine_t *e, const char *text, size_t len, int add_special, int parse_special,
                    int32_t *ids, int max_ids) {
  return tokenizer_encode(e->tok, text, len, add_special, parse_special, ids, max_ids);
}

int pagoda_has_chat_template(const pagoda_engine_t *e) { return tokenizer_chat_template(e->tok) != NULL; }

static int add_token_string(cJSON *ctx, const char *key, const struct tokenizer *t, int id) {
  size_t len = 0;
  const char *s = id >= 0 ? tokenizer_token_text(t, id, &len) : NULL;
  char *copy = malloc(len + 1);
  if (!copy)
    return -1;
  if (s)
    memcpy(copy, s, len);
  copy[len] = 0;
  cJSON *v = cJSON_AddStringToObject(ctx, key, copy);
  free(copy);
  return v ? 0 : -1;
}

int pagoda_render_chat(const pagoda_engine_t *e, const char *messages_json, int add_generation_prompt, char **out) {
  return pagoda_render_chat_ext(e, NULL, messages_json, NULL, add_generation_prompt, out);
}

const char *pagoda_chat_template(const pagoda_engine_t *e) { return tokenizer_chat_template(e->tok); }

int pagoda_render_chat_ext(const pagoda_engine_t *e, const char *template_text, const char *messages_json,
                           const char *extra_json, int add_generation_prompt, char **out) {
  *out = NULL;
  const char *tmpl = template_text ? template_text : tokenizer_chat_template(e->tok);
  if (!tmpl)
    return ERR("the model has no chat template"), PAGODA_ERR_NOT_FOUND;
  cJSON *ctx = cJSON_CreateObject(), *msgs = cJSON_Parse(messages_json);
  int st = PAGODA_ERR_INVALID_ARG;
  if (!ctx || !msgs || !cJSON_IsArray(msgs)) {
    ERR("messages must be a JSON array");
    goto done;
  }
  cJSON_AddItemToObject(ctx, "messages", msgs);
  msgs = NULL;
  if (extra_json) {
    cJSON *extra = cJSON_Parse(extra_json);
    if (!cJSON_IsObject(extra)) {
      cJSON_Delete(extra);
      ERR("the extra template context must be a JSON object");
      goto done;
    }
    for (cJSON *it = extra->child, *nx; it; it = nx) {
      nx = it->next;
      cJSON_AddItemToObject(ctx, it->string, cJSON_DetachItemViaPointer(extra, it));
    }
    cJSON_Delete(extra);
  }
  cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt);
  if (add_token_string(ctx, "bos_token", e->tok, tokenizer_bos_id(e->tok)) ||
      add_token_string(ctx, "eos_token", e->tok, tokenizer_eos_id(e->tok))) {
    st = PAGODA_ERR_OUT_OF_MEMORY;
    goto done;
  }
  char *err = NULL;
  size_t len;
  int line, col;
  *out = chat_template_render_loc(tmpl, ctx, &len, &err, &line, &col);
  if (!*out) {
    if (line > 0)
      ERR("chat template, line %d column %d: %s", line, col, err ? err : "render failed");
    else
      ERR("chat template: %s", err ? err : "render failed");
    free(err);
    goto done;
  }
  st = PAGODA_OK;
done:
  cJSON_Delete(ctx);
  cJSON_Delete(msgs);
  return st;
}

int pagoda_detokenize(const pagoda_engine_t *e, const int32_t *ids, int n_ids, int skip_special,
                      char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  for (int i = 0; i < n_ids; i++)
    if (ids[i] < 0 || ids[i] >= e->vocab)
      return ERR("token id %d at position %d is outside the vocabulary [0, %d)", ids[i], i, e->vocab),
             PAGODA_ERR_INVALID_ARG;
  struct detokenizer *d = detokenizer_create(e->tok, skip_special);
  size_t cap = 64 + (size_t)n_ids * 16, n = 0;
  char *buf = malloc(cap);
  if (!d || !buf) {
    if (d)
      detokenizer_free(d);
    free(buf);
    return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
  }
  char piece[1024];
  for (int i = 0;; i++) { /* the pushes, then flushes until nothing is held back */
    int k = i < n_ids ? detokenizer_push(d, ids[i], piece, sizeof piece) : detokenizer_flush(d, piece, sizeof piece);
    if (i >= n_ids && k <= 0)
      break;
    if (k < 0)
      k = 0;
    if (n + (size_t)k + 1 > cap) {
      while (n + (size_t)k + 1 > cap)
        cap *= 2;
      char *p = realloc(buf, cap);
      if (!p) {
        free(buf);
        detokenizer_free(d);
        return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
      }
      buf = p;
    }
    memcpy(buf + n, piece, (size_t)k);
    n += (size_t)k;
  }
  buf[n] = 0;
  detokenizer_free(d);
  *out = buf;
  *len = n;
  return PAGODA_OK;
}

int pagoda_token_piece(const pagoda_engine_t *e, int32_t id, char *buf, size_t cap) {
  if (id < 0 || id >= e->vocab || cap == 0)
    return -1;
  struct detokenizer *d = detokenizer_create(e->tok, 0);
  if (!d)
    return -1;
  detokenizer_set_continuation(d);
  int n = detokenizer_push(d, id, buf, cap - 1);
  detokenizer_free(d);
  if (n <= 0) { /* held back: part of a UTF-8 character. A SentencePiece byte token "<0xHH>"
                  * gives its raw byte; otherwise the decoder's text (U+FFFD for a lone part). */
    size_t tl = 0;
    const char *t = tokenizer_token_text(e->tok, id, &tl);
    unsigned byte;
    char close;
    if (t && tl == 6 && sscanf(t, "<0x%2X%c", &byte, &close) == 2 && close == '>') {
      buf[0] = (char)byte;
      n = 1;
    } else {
      n = tokenizer_decode(e->tok, &id, 1, 0, buf, cap);
      if (n < 0 || (size_t)n >= cap)
        n = 0;
    }
  }
  buf[n] = 0;
  return n;
}
