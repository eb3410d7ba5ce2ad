/* pagoda.h - the public C API of libpagoda: an LLM inference engine built around PagedAttention.
 * Plain C; opaque handles; every call returns a status (pagoda_status) or a value documented below. */
#ifndef PAGODA_H
#define PAGODA_H

#include <stddef.h>
#include <stdint.h>

struct pagoda_output;

#ifdef __cplusplus
extern "C" {
#endif

#define PAGODA_VERSION "0.1.0"

enum pagoda_status {
  PAGODA_OK = 0,
  PAGODA_ERR_INVALID_ARG = 1,   /* a parameter or request is malformed */
  PAGODA_ERR_IO = 2,            /* a file could not be read */
  PAGODA_ERR_FORMAT = 3,        /* a file is malformed */
  PAGODA_ERR_UNSUPPORTED = 4,   /* valid but not supported (dtype, architecture) */
  PAGODA_ERR_OUT_OF_MEMORY = 5, /* host or device memory */
  PAGODA_ERR_TOO_LONG = 6,      /* a request can never fit (context or pool) */
  PAGODA_ERR_NOT_FOUND = 7,     /* unknown request id */
  PAGODA_ERR_BACKEND = 8,       /* a device call failed */
};

/* The message of the last error on this thread (a human sentence). */
const char *pagoda_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Engine. One thread owns an engine: it calls pagoda_engine_step in a loop; pagoda_add_request*
 * and pagoda_abort may be called between steps (from that thread: the engine has no locks; a
 * multi-threaded front end funnels requests through a queue drained between steps).
 * ------------------------------------------------------------------------------------------- */
typedef struct pagoda_engine pagoda_engine_t;

enum pagoda_paged_attn {
  PAGODA_PAGED_ATTN_AUTO = 0, /* = on */
  PAGODA_PAGED_ATTN_ON = 1,
  PAGODA_PAGED_ATTN_OFF = 2,  /* contiguous per-sequence cache with the sequence-level prefix cache */
};

enum pagoda_cache_type {
  PAGODA_CACHE_TYPE_AUTO = 0,   /* f16 for a GGUF model on the CPU (llama.cpp's default), else the
                                   compute dtype (f32 on CPU, bf16 on CUDA) */
  PAGODA_CACHE_TYPE_F8E4M3 = 1, /* not implemented yet: pagoda_engine_create refuses it */
  PAGODA_CACHE_TYPE_F32 = 2,    /* CPU */
  PAGODA_CACHE_TYPE_F16 = 3,    /* CPU: computed as llama.cpp's CPU attention over an f16 cache */
  PAGODA_CACHE_TYPE_BF16 = 4,   /* CUDA */
};

struct pagoda_engine_params {
  const char *model;          /* HF directory or .gguf file; NULL: $PAGODA_MODEL when set, else
                                 pagoda_default_model() */
  const char *device;         /* "cpu" or "cuda"; NULL: cuda when a GPU is present */
  int threads;                /* CPU threads; 0: all cores */
  enum pagoda_paged_attn paged_attn;
  int block_size;             /* 8, 16 or 32 (default 32) */
  /* KV pool budget: at most one of these three set (> 0); none: 90% of the memory free after
   * the weights, the step workspace and (on CUDA) a profiling step at the largest batch, capped
   * at what max_num_seqs sequences of max_model_len tokens can use (docs/kv-cache.md). */
  double pa_memory_mb;        /* MiB for the pool */
  double pa_memory_fraction;  /* fraction (0, 1] of that free memory */
  int pa_context_len;         /* room for max_num_seqs sequences of this many tokens */
  enum pagoda_cache_type cache_type;
  int prefix_cache_n;         /* default 16; 0 disables prefix caching */
  int max_num_seqs;           /* sequences per step (default 256) */
  int max_num_batched_tokens; /* tokens per step (default 8192) */
  int prefill_chunk_size;     /* prompt tokens of one sequence per step (default 4096) */
  int max_model_len;          /* longest prompt + output; 0: the model's context */
  /* Optional: called for every output of a step, before pagoda_engine_step returns. */
  void (*on_output)(const struct pagoda_output *out, void *user);
  void *user;
  /* In-situ quantization of the float weight matrices at load: "q4_0", "q4_k", "q5_k", "q6_k",
   * "q8_0", or "4" (q4_k) / "8" (q8_0); NULL: none (docs/model-formats.md). */
  const char *isq;
};

/* Fills P with the defaults above. */
void pagoda_engine_params_default(struct pagoda_engine_params *p);
/* The model used when params.model is NULL and PAGODA_MODEL is unset: the path (fixed at build
 * time) where scripts/setup.sh --model puts SmolLM2-135M-Instruct Q4_1. */
const char *pagoda_default_model(void);

struct pagoda_sampling_params {
  int n;                      /* independent samples of one prompt (default 1); they share its KV */
  float temperature;          /* default 1; 0: greedy (argmax, first index on ties) */
  int top_k;                  /* 0 or -1: off */
  float top_p;                /* 1: off */
  float min_p;                /* 0: off */
  int64_t seed;               /* -1: random; else the samples are a function of seed and prompt */
  int max_tokens;             /* new tokens at most; -1: up to max_model_len */
  int min_tokens;             /* EOS and stop token ids are suppressed before this many */
  int ignore_eos;             /* 1: keep going after EOS / end-of-turn tokens */
  const char *const *stop;    /* (n_stop) stop strings: output ends before the first match */
  int n_stop;
  const int32_t *stop_token_ids; /* (n_stop_token_ids) */
  int n_stop_token_ids;
  float presence_penalty;     /* OpenAI definitions, over generated tokens */
  float frequency_penalty;
  float repetition_penalty;   /* HF definition over prompt + generated; 1: off */
  const int32_t *logit_bias_ids;  /* (n_logit_bias) */
  const float *logit_bias_values; /* (n_logit_bias) added to those logits */
  int n_logit_bias;
  int beam_width;             /* > 1: beam search (deterministic; ignores temperature and n) */
  float length_penalty;       /* beam score = sum logprob / length^length_penalty (default 1) */
  int skip_special_tokens;    /* default 1: special tokens add no text */
  int prompt_logprobs;        /* 1: report log P(prompt[i+1] | prompt[0..i]) for every prompt
                                 position (the logits of all of them are computed; the request
                                 skips the prefix cache so that none is left out). Default 0 */
};

/* Fills P with the defaults above. */
void pagoda_sampling_params_default(struct pagoda_sampling_params *p);

enum pagoda_finish_reason {
  PAGODA_FINISH_NONE = 0,   /* still running */
  PAGODA_FINISH_STOP = 1,   /* EOS, a stop string or a stop token id */
  PAGODA_FINISH_LENGTH = 2, /* max_tokens or max_model_len */
  PAGODA_FINISH_ABORT = 3,  /* pagoda_abort */
};

struct pagoda_usage {
  int prompt_tokens;
  int completion_tokens;    /* over all samples of the request */
  int cached_prompt_tokens; /* prompt tokens served by the prefix cache */
};

/* What one sequence of a request produced in one step. Pointers stay valid until the next
 * pagoda_engine_step or pagoda_engine_free. */
struct pagoda_output {
  uint64_t request_id;
  int index;                  /* sample index in [0, n) (beam rank for beam search) */
  const int32_t *token_ids;   /* (num_token_ids) tokens generated this step */
  int num_token_ids;
  const char *text;           /* (text_len) UTF-8 text completed this step (not NUL-terminated) */
  size_t text_len;
  enum pagoda_finish_reason finish_reason;
  struct pagoda_usage usage;  /* of the whole request, once it finished; else partial */
  /* Requests with prompt_logprobs: set once, on the output of sample 0 in the step that finished
   * the prompt; entry i = natural-log probability of prompt token i+1 given tokens 0..i, from the
   * raw logits (no sampling processors). Else NULL and 0. */
  const float *prompt_logprobs; /* (num_prompt_logprobs) = prompt tokens - 1 */
  int num_prompt_logprobs;
};

/* Loads the model and tokenizer, sizes and allocates the KV pool. *OUT: free with
 * pagoda_engine_free. Returns PAGODA_OK or a status with pagoda_last_error() naming the problem
 * (and the flag to change, for an impossible memory budget). */
int pagoda_engine_create(const struct pagoda_engine_params *p, pagoda_engine_t **out);
void pagoda_engine_free(pagoda_engine_t *e);

/* Queues a request. TEXT is encoded as is (BOS added as the tokenizer says, special-token
 * text not parsed); IDS are used as given. SP NULL: defaults. *ID gets the request id.
 * PAGODA_ERR_TOO_LONG when it could never fit (context or pool), PAGODA_ERR_INVALID_ARG on bad
 * parameters or token ids; the engine is unchanged then. */
int pagoda_add_request(pagoda_engine_t *e, const char *text, const struct pagoda_sampling_params *sp,
                       uint64_t *id);
int pagoda_add_request_tokens(pagoda_engine_t *e, const int32_t *ids, int n_ids,
                              const struct pagoda_sampling_params *sp, uint64_t *id);

/* Runs one step (scheduling, forward, sampling). *OUTS / *N_OUTS: this step's outputs (may be
 * none). Returns PAGODA_OK, or a status when the forward pass failed. */
int pagoda_engine_step(pagoda_engine_t *e, const struct pagoda_output **outs, int *n_outs);
/* 1 while any request is waiting or running. */
int pagoda_engine_has_work(const pagoda_engine_t *e);
/* Ends request ID now: its blocks return to the pool; the next step reports it finished with
 * PAGODA_FINISH_ABORT. PAGODA_ERR_NOT_FOUND for an unknown or finished id. */
int pagoda_abort(pagoda_engine_t *e, uint64_t id);

struct pagoda_engine_stats {
  int num_blocks;              /* usable KV blocks (the null block excluded) */
  int block_size;
  int free_blocks;             /* unreferenced blocks (cached ones included) */
  int running, waiting;        /* sequences */
  double kv_usage;             /* referenced blocks / num_blocks now */
  double kv_peak_usage;        /* max of kv_usage after any step */
  double kv_waste_fraction;    /* allocated-but-unused slots / allocated slots, summed over steps */
  int64_t prefix_queries;      /* prompt tokens looked up in the prefix cache */
  int64_t prefix_hits;         /* of those, served from the cache */
  int64_t prefix_evictions;
  int64_t preemptions;
  int64_t steps;
  int64_t prompt_tokens_computed; /* prompt (and recomputed) tokens run through the model */
  int64_t generated_tokens;
  int paged;                   /* 1: PagedAttention block pool; 0: contiguous */
};
int pagoda_engine_stats(const pagoda_engine_t *e, struct pagoda_engine_stats *s);

/* Model facts the front ends need. */
int pagoda_max_model_len(const pagoda_engine_t *e);
int pagoda_vocab_size(const pagoda_engine_t *e);

/* Encodes TEXT (len bytes) with the model's tokenizer; semantics of tokenizer_encode: returns the
 * full count (may exceed max_ids) or -1. */
int pagoda_tokenize(const pagoda_engine_t *e, const char *text, size_t len, int add_special,
                    int parse_special, int32_t *ids, int max_ids);
/* 1 when the model has a chat template. */
int pagoda_has_chat_template(const pagoda_engine_t *e);
/* Renders the model's chat template for MESSAGES_JSON (a JSON array of {role, content}) with
 * add_generation_prompt and the tokenizer's bos/eos token strings. *OUT: malloc'd text, free with
 * free(). PAGODA_ERR_NOT_FOUND when the model has no chat template. */
int pagoda_render_chat(const pagoda_engine_t *e, const char *messages_json, int add_generation_prompt,
                       char **out);

#ifdef __cplusplus
}
#endif
#endif
