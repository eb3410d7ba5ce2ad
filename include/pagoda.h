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

/* libpagoda.so is built with -fvisibility=hidden: what this header declares is all it exports
 * (every name starts with pagoda_; tests/check_boundary.sh checks it). */
#pragma GCC visibility push(default)

#define PAGODA_VERSION "0.1.0"

enum pagoda_status {
  PAGODA_OK = 0,
  PAGODA_ERR_INVALID_ARG = 1,   /* a parameter or request is malformed */
  PAGODA_ERR_IO = 2,            /* a file could not be read */
  PAGODA_ERR_FORMAT = 3,        /* a file is malformed */
  PAGODA_ERR_UNSUPPORTED = 4,   /* valid but not supported (dtype, architecture) */
  PAGODA_ERR_OUT_OF_MEMORY = 5, /* host or device memory */
  PAGODA_ERR_TOO_LONG = 6,      /* a request can never fit (context or pool) */
  PAGODA_ERR_NOT_FOUND = 7,     /* unknown request id; a model, repo, revision or file that is absent */
  PAGODA_ERR_BACKEND = 8,       /* a device call failed */
  PAGODA_ERR_BUSY = 9,          /* async engine: the waiting queue is full (HTTP 429) */
  PAGODA_ERR_CLOSED = 10,       /* async engine: shutting down, no new requests (HTTP 503) */
  PAGODA_ERR_TIMEOUT = 11,      /* async engine: nothing arrived within the timeout */
};

/* The message of the last error on this thread (a human sentence). */
const char *pagoda_last_error(void);

/* sizeof(struct pagoda_NAME) in this build of the library (NAME: "engine_params",
 * "sampling_params", "usage", "output", "engine_stats", "async_params", "event", "async_stats"),
 * 0 for an unknown name. Bindings that mirror these structs (ctypes) check their layout with it. */
size_t pagoda_struct_size(const char *name);

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
  PAGODA_CACHE_TYPE_F8E4M3 = 1, /* FP8 E4M3, per-layer scales: half the bytes of bf16 */
  PAGODA_CACHE_TYPE_F32 = 2,    /* CPU */
  PAGODA_CACHE_TYPE_F16 = 3,    /* CPU: computed as llama.cpp's CPU attention over an f16 cache */
  PAGODA_CACHE_TYPE_BF16 = 4,   /* CUDA */
};

struct pagoda_engine_params {
  const char *model;          /* HF directory, .gguf file, or a Hugging Face repo id org/name
                                 (pagoda_resolve_model; a local path that exists wins); NULL:
                                 $PAGODA_MODEL when set, else pagoda_default_model() */
  const char *revision;       /* repo id only: branch, tag or commit (NULL: "main") */
  const char *hf_file;        /* repo id only: the one file to use (a .gguf); NULL: the
                                 safetensors weights, else the repo's single .gguf */
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
  /* Tensor parallelism: the model split over this many GPUs of this host, one thread and stream
   * each (docs/distributed.md); 0: $PAGODA_TP when set, else 1. The memory flags apply per GPU. */
  int tp;
  /* Multi-process tensor parallelism (docs/distributed.md), as torchrun's RANK / WORLD_SIZE /
   * MASTER_ADDR:MASTER_PORT: this process is rank tp_rank of tp_world processes, one GPU each
   * ($LOCAL_RANK, else the rank; 0 when $CUDA_VISIBLE_DEVICES names one GPU), joined through
   * rank 0's TCP rendezvous at tp_master ("host:port"; rank 0 listens there). Rank 0 creates the
   * engine; a rank > 0 calls pagoda_tp_worker_run. tp_rank -1 (the default): $PAGODA_TP_RANK,
   * else 0; tp_world 0: $PAGODA_TP_WORLD, else 1 (one process); tp_master NULL:
   * $PAGODA_TP_MASTER. Not combined with tp > 1. */
  int tp_rank;
  int tp_world;
  const char *tp_master;
};

/* Fills P with the defaults above. */
void pagoda_engine_params_default(struct pagoda_engine_params *p);

/* Multi-process tensor parallelism: the rank P gives this process (tp_rank, else
 * $PAGODA_TP_RANK, else 0; 0 for a single process), or -1 (pagoda_last_error) when the
 * parameters or variables are invalid. */
int pagoda_tp_rank(const struct pagoda_engine_params *p);
/* A rank > 0 of a multi-process group: loads its shard of P->model, joins rank 0's rendezvous
 * (refused unless every rank has the same world, model and flags that shape the shards) and
 * runs the model calls rank 0's engine sends, until that engine is freed (PAGODA_OK). Returns an
 * error (pagoda_last_error naming the rank or the flag) when the rendezvous is refused, the
 * shard cannot load, or rank 0 is lost. */
int pagoda_tp_worker_run(const struct pagoda_engine_params *p);
/* The model used when params.model is NULL and PAGODA_MODEL is unset: the path (fixed at build
 * time) where scripts/setup.sh --model puts SmolLM2-135M-Instruct Q4_1. */
const char *pagoda_default_model(void);

/* Resolves MODEL to a local path, *PATH (malloc'd; free with free()). A local file or directory
 * that exists is used as it is (FILE, when given, names a file inside that directory).
 * Otherwise MODEL is a Hugging Face repo id (org/name), looked up in the huggingface_hub cache
 * ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub) at REVISION (NULL: "main";
 * branch, tag or commit sha) and, when absent there, downloaded from the hub ($HF_ENDPOINT,
 * $HF_TOKEN; resumable; progress on stderr) into that cache in huggingface_hub's layout.
 * $HF_HUB_OFFLINE=1: the cache only. The files: FILE alone when given (*PATH is that file);
 * else config.json, the tokenizer files and the safetensors weights (*PATH is the snapshot
 * directory); else the repo's only .gguf (*PATH is that file). pagoda_engine_create calls it.
 * Returns PAGODA_OK, or PAGODA_ERR_NOT_FOUND (repo, revision or file absent), PAGODA_ERR_IO
 * (network, HTTP 401/403 and the like, disk), PAGODA_ERR_INVALID_ARG, with pagoda_last_error(). */
int pagoda_resolve_model(const char *model, const char *revision, const char *file, char **path);

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
  /* Logprobs (not with beam search): of the raw model distribution, log softmax of the logits
   * before logit_bias, penalties, temperature and truncation (vLLM's default "raw_logprobs"). */
  int logprobs;               /* 1: report each sampled token's logprob (default 0) */
  int top_logprobs;           /* [0, 20]: also the most likely tokens at each position */
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
  /* With sp.logprobs (else NULL / 0): logprobs[i] of token_ids[i]; top_logprob_ids/top_logprobs
   * (num_token_ids x num_top_logprobs, row-major) the most likely tokens, best first. */
  const float *logprobs;
  const int32_t *top_logprob_ids;
  const float *top_logprobs;
  int num_top_logprobs;
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
 * none); with asynchronous steps (docs/cuda.md; PAGODA_ASYNC_STEPS=0 turns them off) a call
 * launches the next step and reports the one the previous call launched, so the first call's
 * tokens come with the second. Returns PAGODA_OK, or a status when the forward pass failed. */
int pagoda_engine_step(pagoda_engine_t *e, const struct pagoda_output **outs, int *n_outs);
/* 1 while any request is waiting or running, an output is unreported or a launched step unread. */
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

/* ---------------------------------------------------------------------------------------------
 * Tokenizer and chat templates without a model: only the tokenizer files are read, no weights.
 * A tokenizer is immutable after loading; any number of threads may use one at once.
 * ------------------------------------------------------------------------------------------- */
typedef struct pagoda_tokenizer pagoda_tokenizer_t;

/* PATH: a model directory (tokenizer.json [+ tokenizer_config.json]), a tokenizer.json file, or
 * a .gguf file (its tokenizer.ggml.* metadata; the tensors are not read). *OUT: free with
 * pagoda_tokenizer_free. PAGODA_ERR_IO when PATH does not exist, else PAGODA_ERR_FORMAT, with
 * pagoda_last_error() naming the file and the problem. */
int pagoda_tokenizer_load(const char *path, pagoda_tokenizer_t **out);
void pagoda_tokenizer_free(pagoda_tokenizer_t *t);

/* Encodes LEN bytes of TEXT. ADD_SPECIAL: add BOS/EOS as the tokenizer's configuration says.
 * PARSE_SPECIAL: special tokens written in the text (e.g. <|im_end|>) become their ids.
 * Writes at most MAX_IDS ids to IDS (may be NULL when MAX_IDS is 0) and returns how many the
 * whole encoding has (call again with a larger buffer when that is > MAX_IDS), or -1 with
 * pagoda_last_error() set. */
int pagoda_tokenizer_encode(const pagoda_tokenizer_t *t, const char *text, size_t len, int add_special,
                            int parse_special, int32_t *ids, int max_ids);

/* Decodes N ids into OUT (CAP bytes, NUL-terminated when CAP > 0; OUT may be NULL when CAP is
 * 0). Returns the full length in bytes (call again with CAP > that when it is >= CAP), or -1
 * with pagoda_last_error() set (an id out of range). SKIP_SPECIAL: special tokens add no text. */
int pagoda_tokenizer_decode(const pagoda_tokenizer_t *t, const int32_t *ids, int n, int skip_special,
                            char *out, size_t cap);

/* Vocabulary size; BOS / EOS ids (-1 when the tokenizer has none). */
int pagoda_tokenizer_vocab_size(const pagoda_tokenizer_t *t);
int pagoda_tokenizer_bos_id(const pagoda_tokenizer_t *t);
int pagoda_tokenizer_eos_id(const pagoda_tokenizer_t *t);
/* The chat template source (tokenizer_config.json's chat_template or the GGUF's
 * tokenizer.chat_template), owned by T; NULL when there is none. */
const char *pagoda_tokenizer_chat_template(const pagoda_tokenizer_t *t);

/* Renders the Jinja chat template TEMPLATE_SRC (NUL-terminated) with the variables of
 * CONTEXT_JSON (CONTEXT_LEN bytes: a JSON object such as {"messages": [...],
 * "add_generation_prompt": true, "bos_token": "<s>"}), configured as HF transformers
 * configures Jinja2. JSON numbers keep Python's int/float distinction (1.0 stays a float).
 * *OUT: the rendering, malloc'd (free with free()), *OUT_LEN bytes plus a NUL (the rendering
 * may itself contain NUL bytes). PAGODA_ERR_INVALID_ARG when the context is not a JSON object,
 * PAGODA_ERR_FORMAT for a template error or raise_exception: pagoda_last_error() is then the
 * template's message (raise_exception's own text), cut at 1023 bytes. */
int pagoda_render_template(const char *template_src, const char *context_json, size_t context_len,
                           char **out, size_t *out_len);
/* Where the last template error of pagoda_render_template on this thread is: *LINE and *COL
 * (1-based) of the construct that failed. Returns 1 when known, 0 otherwise (both set to 0). */
int pagoda_template_error_location(int *line, int *col);

/* Decodes IDS (n_ids) to text (special tokens skipped when SKIP_SPECIAL). *OUT: malloc'd,
 * NUL-terminated, free with free(); *LEN its length. PAGODA_ERR_INVALID_ARG for an id outside
 * the vocabulary. Safe from any thread (like pagoda_tokenize and pagoda_render_chat). */
int pagoda_detokenize(const pagoda_engine_t *e, const int32_t *ids, int n_ids, int skip_special,
                      char **out, size_t *len);
/* The text of token ID as the model's tokenizer decodes it in the middle of a text (leading
 * space kept), into BUF (cap bytes, NUL-terminated). A SentencePiece byte token (<0xHH>) that is
 * part of a UTF-8 character gives its raw byte; other partial characters give U+FFFD. Returns
 * its length, or -1 for an id outside the vocabulary. */
int pagoda_token_piece(const pagoda_engine_t *e, int32_t id, char *buf, size_t cap);
/* Like pagoda_render_chat, with TEMPLATE (NULL: the model's) and EXTRA_JSON (NULL or a JSON
 * object) merged into the template context: e.g. {"tools": [...]} for tool calling. */
int pagoda_render_chat_ext(const pagoda_engine_t *e, const char *template_text, const char *messages_json,
                           const char *extra_json, int add_generation_prompt, char **out);
/* The model's chat template source, or NULL. */
const char *pagoda_chat_template(const pagoda_engine_t *e);

/* ---------------------------------------------------------------------------------------------
 * Async engine: a thread-safe front for multi-threaded servers. pagoda_async_create starts one
 * thread that owns the engine and loops: apply queued submissions and aborts, step, hand each
 * output to its stream. Every function below may be called from any thread.
 *   - A stream belongs to the thread that submitted it until pagoda_stream_free; one thread at a
 *     time calls pagoda_stream_next on it; pagoda_stream_abort may come from any thread.
 *   - Event pointers stay valid until the next pagoda_stream_next or pagoda_stream_free on it.
 *   - pagoda_async_engine's engine may be used only with the read-only helpers marked safe from
 *     any thread (tokenize, detokenize, token_piece, render_chat*, has_chat_template,
 *     chat_template, max_model_len, vocab_size); never step, add or abort it directly.
 * ------------------------------------------------------------------------------------------- */
typedef struct pagoda_async pagoda_async_t;
typedef struct pagoda_stream pagoda_stream_t;

struct pagoda_async_params {
  int max_waiting;  /* submitted requests without their first token yet, at most (default 1024);
                       beyond: PAGODA_ERR_BUSY */
};
void pagoda_async_params_default(struct pagoda_async_params *p);

/* Creates the engine from EP (ep->on_output must be NULL: the async layer uses the outputs) and
 * starts its thread. */
int pagoda_async_create(const struct pagoda_engine_params *ep, const struct pagoda_async_params *ap,
                        pagoda_async_t **out);
/* Stops accepting requests (PAGODA_ERR_CLOSED), lets running ones finish for up to GRACE_MS,
 * aborts the rest (their streams get PAGODA_FINISH_ABORT), and joins the thread. Idempotent. */
void pagoda_async_shutdown(pagoda_async_t *a, int grace_ms);
/* Shuts down (grace 0) if needed and frees the engine. Free every stream before. */
void pagoda_async_free(pagoda_async_t *a);
const pagoda_engine_t *pagoda_async_engine(const pagoda_async_t *a);

/* Queues a request: TEXT (encoded as pagoda_add_request does) or IDS (n_ids), SP NULL for the
 * defaults. Waits until the engine thread accepted or rejected it (at most one step). *OUT: the
 * stream, free with pagoda_stream_free. PAGODA_ERR_BUSY (queue full), PAGODA_ERR_CLOSED, or the
 * engine's own status (INVALID_ARG, TOO_LONG, ...) with pagoda_last_error() on this thread. */
int pagoda_async_submit(pagoda_async_t *a, const char *text, const int32_t *ids, int n_ids,
                        const struct pagoda_sampling_params *sp, pagoda_stream_t **out);

/* One output of one sample (the fields of struct pagoda_output, copied). */
struct pagoda_event {
  int index;
  const int32_t *token_ids;
  int num_token_ids;
  const char *text;           /* NUL-terminated too */
  size_t text_len;
  const float *logprobs;      /* as in struct pagoda_output */
  const int32_t *top_logprob_ids;
  const float *top_logprobs;
  int num_top_logprobs;
  enum pagoda_finish_reason finish_reason;
  struct pagoda_usage usage;
};
/* Blocks (without spinning) until the next event, at most TIMEOUT_MS (< 0: forever).
 * PAGODA_OK: *EV filled. PAGODA_ERR_TIMEOUT: none yet. PAGODA_ERR_NOT_FOUND: the stream ended
 * (every sample reported its finish). */
int pagoda_stream_next(pagoda_stream_t *s, struct pagoda_event *ev, int timeout_ms);
/* Ends the request: its KV blocks return to the pool within one engine step; the stream then
 * delivers PAGODA_FINISH_ABORT for unfinished samples. */
void pagoda_stream_abort(pagoda_stream_t *s);
uint64_t pagoda_stream_id(const pagoda_stream_t *s);
/* Aborts the request if still running and releases the caller's reference. */
void pagoda_stream_free(pagoda_stream_t *s);

struct pagoda_async_stats {
  struct pagoda_engine_stats engine; /* after the last step */
  int queued;                        /* submitted, no token yet */
  int active;                        /* submitted, not finished */
  int64_t submitted, finished, rejected_busy, aborted;
  int accepting;                     /* 0 once shutting down */
  int64_t step_failures;             /* steps that failed (device error, or nothing could progress) */
};
int pagoda_async_stats(pagoda_async_t *a, struct pagoda_async_stats *s);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
