/* server.c - `pagoda serve`: OpenAI-compatible HTTP API on libmicrohttpd.
 *
 * Threads: libmicrohttpd runs one thread per connection; each request handler parses its JSON,
 * renders/tokenizes the prompt on its own thread (the tokenizer keeps per-thread scratch) and
 * submits token ids to the async engine, whose single thread owns the engine. Non-streaming
 * handlers block on their streams; streaming responses are produced by a content-reader callback
 * that blocks on the stream (with a keep-alive timeout). When the client goes away, libmicrohttpd
 * frees the response, whose free callback frees (= aborts) the stream, so its KV blocks return
 * to the pool within one engine step. Metrics are counters and histograms under one mutex. */
#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

extern const unsigned char pagoda_chat_page[];
extern const size_t pagoda_chat_page_len;

#define MAX_PROMPT_IDS (1 << 20)

/* ---- growable buffer ---- */

struct buf {
  char *p;
  size_t len, cap;
};

static void buf_add(struct buf *b, const char *s, size_t n) {
  if (n > ((size_t)1 << 40))
    abort(); /* a negative length turned size_t: a bug, never data */
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
      abort(); /* out of memory for a response: nothing sensible to send */
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* S (N bytes, may hold NUL bytes) as a JSON string literal into B: quotes, backslashes and
 * control bytes escaped, NUL as \u0000, so a string keeps its length. */
static void buf_json_string(struct buf *b, const char *s, size_t n) {
  buf_add(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') {
      char e[2] = {'\\', (char)ch};
      buf_add(b, e, 2);
    } else if (ch == '\n') {
      buf_add(b, "\\n", 2);
    } else if (ch < 0x20) {
      char e[8];
      snprintf(e, sizeof e, "\\u%04x", ch);
      buf_add(b, e, 6);
    } else {
      buf_add(b, (const char *)&ch, 1);
    }
  }
  buf_add(b, "\"", 1);
}

/* A cJSON item that prints as the JSON string of S (N bytes, NUL bytes kept as \u0000). */
static cJSON *json_string_n(const char *s, size_t n) {
  struct buf b = {0};
  buf_json_string(&b, s, n);
  buf_add(&b, "", 1);
  cJSON *j = cJSON_CreateRaw(b.p);
  free(b.p);
  return j;
}

/* Byte offset of the first \u0000 escape in the JSON text BODY (LEN bytes), or -1. cJSON keeps
 * C strings, so such a string would be cut short silently: the server refuses it instead. */
static long json_nul_escape(const char *body, size_t len) {
  for (size_t i = 0; i + 5 < len; i++) {
    if (body[i] != '\\')
      continue;
    if (body[i + 1] == 'u' && body[i + 2] == '0' && body[i + 3] == '0' && body[i + 4] == '0' && body[i + 5] == '0')
      return (long)i;
    i++; /* skip the escaped character (an escaped backslash is not the start of an escape) */
  }
  return -1;
}

/* *OUT = the integral JSON number V when it lies in [LO, HI); 0, else -1. */
static int int_in_range(const cJSON *v, double lo, double hi, int32_t *out) {
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
      v->valuedouble < lo || v->valuedouble >= hi)
    return -1;
  *out = (int32_t)v->valuedouble;
  return 0;
}

static void buf_fmt(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_fmt(struct buf *b, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0)
    buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- metrics ---- */

#define HIST_BUCKETS 14
static const double hist_bounds[HIST_BUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                                 0.1,   0.25,  0.5,  1.0,  2.5,  5.0,  10.0};
struct hist {
  int64_t counts[HIST_BUCKETS + 1];
  double sum;
  int64_t n;
};

static void hist_add(struct hist *h, double v) {
  int i = 0;
  while (i < HIST_BUCKETS && v > hist_bounds[i])
    i++;
  h->counts[i]++;
  h->sum += v;
  h->n++;
}

static void hist_print(struct buf *b, const char *name, const char *help, const struct hist *h) {
  buf_fmt(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  int64_t cum = 0;
  for (int i = 0; i < HIST_BUCKETS; i++) {
    cum += h->counts[i];
    buf_fmt(b, "%s_bucket{le=\"%g\"} %lld\n", name, hist_bounds[i], (long long)cum);
  }
  cum += h->counts[HIST_BUCKETS];
  buf_fmt(b, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name, (long long)cum, name, h->sum,
          name, (long long)h->n);
}

/* ---- server state ---- */

struct server {
  const struct server_config *cfg;
  pagoda_async_t *async;
  const pagoda_engine_t *e;
  const char *tmpl; /* effective chat template (NULL: none) */
  char tmpl_fault[600]; /* non-empty: the template failed a one-message render at start-up */
  enum tool_format tool_fmt;
  pthread_mutex_t mu; /* metrics below */
  struct hist ttft, tpot, itl, e2e;
  int64_t req_ok[4];  /* by finish reason: stop, length, abort, tool_calls */
  int64_t http_by_class[6];
  int64_t prompt_tokens, generation_tokens;
  uint64_t next_id;
  int inflight;          /* HTTP requests between their first callback and completion */
  pthread_cond_t idle;   /* signalled when inflight drops to 0 */
};

static const char *finish_name(int f) {
  return f == PAGODA_FINISH_STOP ? "stop" : f == PAGODA_FINISH_LENGTH ? "length" : f == PAGODA_FINISH_ABORT ? "abort" : NULL;
}

/* ---- HTTP helpers ---- */

static enum MHD_Result send_text(struct server *S, struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *body, size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", type);
  MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
  enum MHD_Result rc = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  pthread_mutex_lock(&S->mu);
  S->http_by_class[status / 100 < 6 ? status / 100 : 5]++;
  pthread_mutex_unlock(&S->mu);
  return rc;
}

static enum MHD_Result send_json(struct server *S, struct MHD_Connection *c, unsigned status, cJSON *j) {
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  enum MHD_Result rc = send_text(S, c, status, "application/json", s, strlen(s));
  cJSON_free(s);
  return rc;
}

static const char *error_type(unsigned status) {
  switch (status) {
  case 400: return "invalid_request_error";
  case 401: return "authentication_error";
  case 404: return "not_found_error";
  case 405: return "invalid_request_error";
  case 413: return "invalid_request_error";
  case 429: return "rate_limit_error";
  case 503: return "service_unavailable";
  default: return "server_error";
  }
}

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result send_error(struct server *S, struct MHD_Connection *c, unsigned status, const char *param,
                                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(struct server *S, struct MHD_Connection *c, unsigned status, const char *param,
                                  const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", error_type(status));
  if (param)
    cJSON_AddStringToObject(e, "param", param);
  else
    cJSON_AddNullToObject(e, "param");
  cJSON_AddNumberToObject(e, "code", status);
  return send_json(S, c, status, j);
}

/* ---- request parameters ---- */

/* A parse error: HTTP status, the offending field, the message. */
struct perr {
  unsigned status;
  const char *param;
  char msg[512];
};

static int fail(struct perr *pe, unsigned status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct perr *pe, unsigned status, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pe->msg, sizeof pe->msg, fmt, ap);
  va_end(ap);
  pe->status = status;
  pe->param = param;
  return -1;
}

/* Reads optional number KEY of J into *OUT within [lo, hi]. */
static int get_num(const cJSON *j, const char *key, double lo, double hi, double *out, struct perr *pe) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return fail(pe, 400, key, "'%s' must be a number", key);
  if (v->valuedouble < lo || v->valuedouble > hi)
    return fail(pe, 400, key, "'%s' must be in [%g, %g] (got %g)", key, lo, hi, v->valuedouble);
  *out = v->valuedouble;
  return 0;
}

static int get_int(const cJSON *j, const char *key, long lo, long hi, int *out, struct perr *pe) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
    return fail(pe, 400, key, "'%s' must be an integer", key);
  if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
    return fail(pe, 400, key, "'%s' must be in [%ld, %ld] (got %g)", key, lo, hi, v->valuedouble);
  *out = (int)v->valuedouble;
  return 0;
}

static int get_bool(const cJSON *j, const char *key, int *out, struct perr *pe) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsBool(v))
    return fail(pe, 400, key, "'%s' must be a boolean", key);
  *out = cJSON_IsTrue(v);
  return 0;
}

/* Everything one completion request asks for. */
struct job {
  struct server *S;
  int chat, stream, include_usage, echo;
  int logprobs;             /* chat: bool; completions: number of top logprobs + 1 (0: off) */
  int top_logprobs;
  int n;                    /* choices per prompt */
  int stride;               /* choice slots per prompt: n, or beam_width (the best n are returned) */
  int tools;                /* parse tool calls from the output */
  struct pagoda_sampling_params sp;
  char **stop;
  int n_stop;
  int32_t *stop_ids, *bias_ids;
  float *bias_vals;
  /* prompts */
  int num_prompts;
  int32_t **ids;
  int *n_ids;
  char **prompt_text;       /* for echo */
  pagoda_stream_t **streams;
  /* output */
  char id[48];
  long created;
  struct choice {
    struct buf text;
    cJSON *lp;              /* chat: content array; completions: {tokens, token_logprobs, ...} */
    int finish;
    int role_sent;
    size_t sent;            /* streaming: bytes of text sent as content */
    int num_calls;          /* tool calls parsed (sent, when streaming) */
    int have_from;          /* streaming, Hermes: calls_from is set */
    size_t calls_from;      /* streaming, Hermes: where the next unparsed call block starts */
    int ntok;
  } *ch;
  struct pagoda_usage usage;
  int finished_prompts;
  /* streaming */
  struct buf out;
  size_t out_pos;
  int done;
  /* timing */
  double t_start, t_first, t_last;
  int first_seen;
  struct hist itl;          /* this request's inter-token latencies, merged when it ends */
};

static void job_free(struct job *J) {
  if (!J)
    return;
  for (int i = 0; i < J->num_prompts; i++) {
    if (J->streams && J->streams[i])
      pagoda_stream_free(J->streams[i]);
    if (J->ids)
      free(J->ids[i]);
    if (J->prompt_text)
      free(J->prompt_text[i]);
  }
  free(J->streams);
  free(J->ids);
  free(J->n_ids);
  free(J->prompt_text);
  for (int i = 0; i < J->n_stop; i++)
    free(J->stop[i]);
  free(J->stop);
  free(J->stop_ids);
  free(J->bias_ids);
  free(J->bias_vals);
  for (int i = 0; J->ch && i < J->num_prompts * J->stride; i++) {
    free(J->ch[i].text.p);
    cJSON_Delete(J->ch[i].lp);
  }
  free(J->ch);
  free(J->out.p);
  free(J);
}

static int parse_stop(struct job *J, const cJSON *req, struct perr *pe) {
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(req, "stop");
  if (st && !cJSON_IsNull(st)) {
    if (cJSON_IsString(st)) {
      if (!st->valuestring[0])
        return fail(pe, 400, "stop", "'stop' must be a string or an array of non-empty strings");
      J->stop = malloc(sizeof *J->stop);
      J->stop[J->n_stop++] = strdup(st->valuestring);
    } else if (cJSON_IsArray(st)) {
      int n = cJSON_GetArraySize(st);
      if (n > 16)
        return fail(pe, 400, "stop", "'stop' takes at most 16 strings (got %d)", n);
      J->stop = calloc((size_t)n + 1, sizeof *J->stop);
      const cJSON *it;
      cJSON_ArrayForEach(it, st) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
          return fail(pe, 400, "stop", "'stop' must be a string or an array of non-empty strings");
        J->stop[J->n_stop++] = strdup(it->valuestring);
      }
    } else {
      return fail(pe, 400, "stop", "'stop' must be a string or an array of strings");
    }
  }
  const cJSON *sid = cJSON_GetObjectItemCaseSensitive(req, "stop_token_ids");
  if (sid && !cJSON_IsNull(sid)) {
    if (!cJSON_IsArray(sid))
      return fail(pe, 400, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
    int n = cJSON_GetArraySize(sid), k = 0;
    J->stop_ids = malloc(((size_t)n + 1) * sizeof *J->stop_ids);
    const cJSON *it;
    int vocab = pagoda_vocab_size(J->S->e);
    cJSON_ArrayForEach(it, sid) {
      if (int_in_range(it, 0, vocab, &J->stop_ids[k]))
        return fail(pe, 400, "stop_token_ids", "'stop_token_ids' entries must be integer token ids in [0, %d)", vocab);
      k++;
    }
    J->sp.stop_token_ids = J->stop_ids;
    J->sp.n_stop_token_ids = k;
  }
  J->sp.stop = (const char *const *)J->stop;
  J->sp.n_stop = J->n_stop;
  return 0;
}

static int parse_logit_bias(struct job *J, const cJSON *req, struct perr *pe) {
  const cJSON *lb = cJSON_GetObjectItemCaseSensitive(req, "logit_bias");
  if (!lb || cJSON_IsNull(lb))
    return 0;
  if (!cJSON_IsObject(lb))
    return fail(pe, 400, "logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
  int n = cJSON_GetArraySize(lb), k = 0, vocab = pagoda_vocab_size(J->S->e);
  J->bias_ids = malloc(((size_t)n + 1) * sizeof *J->bias_ids);
  J->bias_vals = malloc(((size_t)n + 1) * sizeof *J->bias_vals);
  const cJSON *it;
  cJSON_ArrayForEach(it, lb) {
    char *end;
    long id = strtol(it->string, &end, 10);
    if (!it->string[0] || *end || id < 0 || id >= vocab)
      return fail(pe, 400, "logit_bias", "'logit_bias' key '%s' is not a token id in [0, %d)", it->string, vocab);
    if (!cJSON_IsNumber(it) || it->valuedouble < -100 || it->valuedouble > 100)
      return fail(pe, 400, "logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
    J->bias_ids[k] = (int32_t)id;
    J->bias_vals[k++] = (float)it->valuedouble;
  }
  J->sp.logit_bias_ids = J->bias_ids;
  J->sp.logit_bias_values = J->bias_vals;
  J->sp.n_logit_bias = k;
  return 0;
}

/* The sampling fields shared by both endpoints. */
static int parse_sampling(struct job *J, const cJSON *req, struct perr *pe) {
  struct pagoda_sampling_params *sp = &J->sp;
  pagoda_sampling_params_default(sp);
  double v;
  int mml = pagoda_max_model_len(J->S->e);
  sp->max_tokens = J->chat ? -1 : 16; /* OpenAI's defaults: the context for chat, 16 for completions */
  if (get_int(req, "max_tokens", 1, mml, &sp->max_tokens, pe) ||
      get_int(req, "max_completion_tokens", 1, mml, &sp->max_tokens, pe))
    return -1;
  v = 1;
  if (get_num(req, "temperature", 0, 2, &v, pe))
    return -1;
  sp->temperature = (float)v;
  v = 1;
  if (get_num(req, "top_p", 1e-9, 1, &v, pe))
    return -1;
  sp->top_p = (float)v;
  if (get_int(req, "top_k", -1, 1 << 30, &sp->top_k, pe))
    return -1;
  v = 0;
  if (get_num(req, "min_p", 0, 1, &v, pe))
    return -1;
  sp->min_p = (float)v;
  v = 0;
  if (get_num(req, "presence_penalty", -2, 2, &v, pe))
    return -1;
  sp->presence_penalty = (float)v;
  v = 0;
  if (get_num(req, "frequency_penalty", -2, 2, &v, pe))
    return -1;
  sp->frequency_penalty = (float)v;
  v = 1;
  if (get_num(req, "repetition_penalty", 1e-6, 100, &v, pe))
    return -1;
  sp->repetition_penalty = (float)v;
  J->n = 1;
  if (get_int(req, "n", 1, 128, &J->n, pe))
    return -1;
  sp->n = J->n;
  const cJSON *seed = cJSON_GetObjectItemCaseSensitive(req, "seed");
  if (seed && !cJSON_IsNull(seed)) {
    if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble) || seed->valuedouble < 0 ||
        seed->valuedouble > 9.2e18)
      return fail(pe, 400, "seed", "'seed' must be a non-negative integer");
    sp->seed = (int64_t)seed->valuedouble;
  }
  if (get_int(req, "min_tokens", 0, mml, &sp->min_tokens, pe) || get_bool(req, "ignore_eos", &sp->ignore_eos, pe) ||
      get_bool(req, "skip_special_tokens", &sp->skip_special_tokens, pe) || get_bool(req, "stream", &J->stream, pe))
    return -1;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
  if (so && !cJSON_IsNull(so)) {
    if (!cJSON_IsObject(so) || get_bool(so, "include_usage", &J->include_usage, pe))
      return fail(pe, 400, "stream_options", "'stream_options' must be an object like {\"include_usage\": true}");
    if (!J->stream)
      return fail(pe, 400, "stream_options", "'stream_options' is only allowed with \"stream\": true");
  }
  if (parse_stop(J, req, pe) || parse_logit_bias(J, req, pe))
    return -1;
  /* Logprobs: chat {logprobs: bool, top_logprobs: 0..20}; completions {logprobs: 0..5}. */
  if (J->chat) {
    int lp = 0;
    if (get_bool(req, "logprobs", &lp, pe) || get_int(req, "top_logprobs", 0, 20, &J->top_logprobs, pe))
      return -1;
    if (J->top_logprobs > 0 && !lp)
      return fail(pe, 400, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    J->logprobs = lp;
  } else {
    int lp = -1;
    if (get_int(req, "logprobs", 0, 5, &lp, pe))
      return -1;
    J->logprobs = lp >= 0;
    J->top_logprobs = lp > 0 ? lp : 0;
  }
  sp->logprobs = J->logprobs;
  sp->top_logprobs = J->top_logprobs;
  /* best_of / use_beam_search (completions): beam search of width best_of, n best returned. */
  int beam = 0, best_of = 0;
  if (get_bool(req, "use_beam_search", &beam, pe) || get_int(req, "best_of", 1, 64, &best_of, pe))
    return -1;
  if (best_of && best_of < J->n)
    return fail(pe, 400, "best_of", "'best_of' (%d) must be >= n (%d)", best_of, J->n);
  if (beam || best_of > 1) {
    if (J->chat)
      return fail(pe, 400, beam ? "use_beam_search" : "best_of", "beam search is available on /v1/completions only");
    if (J->stream)
      return fail(pe, 400, "best_of", "'best_of' / 'use_beam_search' cannot be streamed");
    if (J->logprobs)
      return fail(pe, 400, "logprobs", "logprobs are not available with beam search");
    sp->beam_width = best_of > 1 ? best_of : (J->n > 1 ? J->n : 2);
    sp->n = 1;
    v = 1;
    if (get_num(req, "length_penalty", -10, 10, &v, pe))
      return -1;
    sp->length_penalty = (float)v;
  }
  const cJSON *rf = cJSON_GetObjectItemCaseSensitive(req, "response_format");
  if (rf && !cJSON_IsNull(rf)) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(t) || strcmp(t->valuestring, "text"))
      return fail(pe, 400, "response_format", "'response_format' supports only {\"type\": \"text\"}");
  }
  return 0;
}

/* Tokenizes TEXT (chat prompts: special tokens parsed, no BOS added; the template writes it). */
static int tokenize_prompt(struct job *J, int k, const char *text, int chat, struct perr *pe) {
  size_t len = strlen(text);
  int cap = (int)(len + 16 < MAX_PROMPT_IDS ? len + 16 : MAX_PROMPT_IDS);
  J->ids[k] = malloc((size_t)cap * sizeof(int32_t));
  int n = pagoda_tokenize(J->S->e, text, len, !chat, chat, J->ids[k], cap);
  if (n < 0)
    return fail(pe, 400, "prompt", "the prompt could not be tokenized");
  if (n > cap)
    return fail(pe, 400, "prompt", "the prompt is too long (%d tokens)", n);
  if (n == 0)
    return fail(pe, 400, "prompt", "the prompt is empty");
  J->n_ids[k] = n;
  return 0;
}

static int alloc_prompts(struct job *J, int n) {
  J->num_prompts = n;
  J->ids = calloc((size_t)n, sizeof *J->ids);
  J->n_ids = calloc((size_t)n, sizeof *J->n_ids);
  J->prompt_text = calloc((size_t)n, sizeof *J->prompt_text);
  J->streams = calloc((size_t)n, sizeof *J->streams);
  return 0;
}

static int parse_completion_prompt(struct job *J, const cJSON *req, struct perr *pe) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
  int vocab = pagoda_vocab_size(J->S->e);
  if (cJSON_IsString(p)) {
    alloc_prompts(J, 1);
    J->prompt_text[0] = strdup(p->valuestring);
    return tokenize_prompt(J, 0, p->valuestring, 0, pe);
  }
  if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
    return fail(pe, 400, "prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids");
  const cJSON *first = cJSON_GetArrayItem(p, 0);
  if (cJSON_IsNumber(first)) { /* one prompt of token ids */
    alloc_prompts(J, 1);
    int n = cJSON_GetArraySize(p), k = 0;
    J->ids[0] = malloc((size_t)n * sizeof(int32_t));
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
      if (!cJSON_IsNumber(it))
        return fail(pe, 400, "prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids");
      if (int_in_range(it, 0, vocab, &J->ids[0][k]))
        return fail(pe, 400, "prompt", "prompt token ids must be integers in [0, %d)", vocab);
      k++;
    }
    J->n_ids[0] = k;
    return 0;
  }
  int n = cJSON_GetArraySize(p);
  if (n > 64)
    return fail(pe, 400, "prompt", "at most 64 prompts per request (got %d)", n);
  alloc_prompts(J, n);
  int k = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, p) {
    if (cJSON_IsString(it)) {
      J->prompt_text[k] = strdup(it->valuestring);
      if (tokenize_prompt(J, k, it->valuestring, 0, pe))
        return -1;
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) > 0) {
      int m = cJSON_GetArraySize(it), j = 0;
      J->ids[k] = malloc((size_t)m * sizeof(int32_t));
      const cJSON *t;
      cJSON_ArrayForEach(t, it) {
        if (!cJSON_IsNumber(t))
          return fail(pe, 400, "prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids");
        if (int_in_range(t, 0, vocab, &J->ids[k][j]))
          return fail(pe, 400, "prompt", "prompt token ids must be integers in [0, %d)", vocab);
        j++;
      }
      J->n_ids[k] = j;
    } else {
      return fail(pe, 400, "prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids");
    }
    k++;
  }
  if (J->stream && n > 1)
    return fail(pe, 400, "prompt", "streaming takes one prompt per request");
  return 0;
}

/* Messages -> the template's input: content parts flattened to text; roles checked. */
static int parse_messages(struct job *J, const cJSON *req, struct perr *pe, char **prompt) {
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
  if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
    return fail(pe, 400, "messages", "'messages' must be a non-empty array");
  if (!J->S->tmpl)
    return fail(pe, 400, "messages",
                "the model has no chat template: use /v1/completions, or start the server with --chat-template FILE");
  if (J->S->tmpl_fault[0]) /* a server-side fault, not the request's */
    return fail(pe, 500, "messages", "%s", J->S->tmpl_fault);
  cJSON *arr = cJSON_CreateArray();
  const cJSON *m;
  int i = 0;
  cJSON_ArrayForEach(m, msgs) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role) ||
        (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
         strcmp(role->valuestring, "assistant") && strcmp(role->valuestring, "tool") &&
         strcmp(role->valuestring, "developer"))) {
      cJSON_Delete(arr);
      return fail(pe, 400, "messages", "messages[%d]: 'role' must be system, developer, user, assistant or tool", i);
    }
    cJSON *copy = cJSON_Duplicate(m, 1);
    if (!strcmp(role->valuestring, "developer"))
      cJSON_ReplaceItemInObjectCaseSensitive(copy, "role", cJSON_CreateString("system"));
    if (cJSON_IsArray(content)) { /* [{type: text, text}] -> one string */
      struct buf t = {0};
      const cJSON *part;
      cJSON_ArrayForEach(part, content) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
          free(t.p);
          cJSON_Delete(copy);
          cJSON_Delete(arr);
          return fail(pe, 400, "messages", "messages[%d]: only text content parts are supported", i);
        }
        buf_str(&t, tx->valuestring);
      }
      cJSON_ReplaceItemInObjectCaseSensitive(copy, "content", cJSON_CreateString(t.p ? t.p : ""));
      free(t.p);
    } else if ((cJSON_IsNull(content) || !content) && strcmp(role->valuestring, "assistant")) {
      cJSON_Delete(copy);
      cJSON_Delete(arr);
      return fail(pe, 400, "messages", "messages[%d].content is missing: a %s message needs 'content'", i,
                  role->valuestring);
    } else if (!cJSON_IsString(content) &&
               !(cJSON_IsNull(content) || !content) /* assistant messages with tool_calls only */) {
      cJSON_Delete(copy);
      cJSON_Delete(arr);
      return fail(pe, 400, "messages", "messages[%d]: 'content' must be a string or an array of text parts", i);
    }
    cJSON_AddItemToArray(arr, copy);
    i++;
  }
  char *mj = cJSON_PrintUnformatted(arr);
  cJSON_Delete(arr);
  /* Tools go into the template context. */
  char *extra = NULL;
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
  const cJSON *choice = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
  /* tool_choice: "auto" (default), "none", "required" (refused: nothing forces a call), or
   * {"type": "function", "function": {"name": N}} with N one of the tools: then only that tool is
   * offered to the model (it is not forced to call it either; docs/http.md). */
  const char *named = NULL;
  if (choice && !cJSON_IsNull(choice)) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(choice, "type");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (cJSON_IsObject(choice) && cJSON_IsString(ty) && !strcmp(ty->valuestring, "function") && cJSON_IsString(nm))
      named = nm->valuestring;
    else if (!cJSON_IsString(choice) || (strcmp(choice->valuestring, "auto") && strcmp(choice->valuestring, "none") &&
                                         strcmp(choice->valuestring, "required"))) {
      cJSON_free(mj);
      return fail(pe, 400, "tool_choice",
                  "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}");
    }
    if (named && (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0)) {
      cJSON_free(mj);
      return fail(pe, 400, "tool_choice", "tool_choice names function '%s' but the request has no 'tools'", named);
    }
  }
  if (tools && !cJSON_IsNull(tools)) {
    if (!cJSON_IsArray(tools)) {
      cJSON_free(mj);
      return fail(pe, 400, "tools", "'tools' must be an array of {type: function, function: {...}}");
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
      const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
      if (!cJSON_IsObject(fn) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name"))) {
        cJSON_free(mj);
        return fail(pe, 400, "tools", "each tool needs {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
    }
    if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) {
      cJSON_free(mj);
      return fail(pe, 400, "tool_choice",
                  "tool_choice \"required\" is not supported (use \"auto\" or \"none\"): the model is not forced to call a tool");
    }
    const cJSON *only = NULL; /* the named tool */
    cJSON_ArrayForEach(t, tools) {
      if (named && !strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name")
                               ->valuestring, named)) {
        only = t;
        break;
      }
    }
    if (named && !only) {
      cJSON_free(mj);
      return fail(pe, 400, "tool_choice", "tool_choice names function '%s', which is not in 'tools'", named);
    }
    int none = cJSON_IsString(choice) && !strcmp(choice->valuestring, "none");
    if (!none && cJSON_GetArraySize(tools) > 0) {
      cJSON *ctx = cJSON_CreateObject();
      cJSON *list = only ? cJSON_CreateArray() : cJSON_Duplicate(tools, 1);
      if (only)
        cJSON_AddItemToArray(list, cJSON_Duplicate(only, 1));
      cJSON_AddItemToObject(ctx, "tools", list);
      extra = cJSON_PrintUnformatted(ctx);
      cJSON_Delete(ctx);
      J->tools = 1;
    }
  }
  int st = pagoda_render_chat_ext(J->S->e, J->S->cfg->chat_template, mj, extra, 1, prompt);
  cJSON_free(mj);
  cJSON_free(extra);
  if (st != PAGODA_OK)
    return fail(pe, 400, "messages", "%s", pagoda_last_error());
  return 0;
}

/* ---- responses ---- */

static cJSON *usage_json(const struct pagoda_usage *u) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "prompt_tokens", u->prompt_tokens);
  cJSON_AddNumberToObject(j, "completion_tokens", u->completion_tokens);
  cJSON_AddNumberToObject(j, "total_tokens", u->prompt_tokens + u->completion_tokens);
  cJSON *d = cJSON_AddObjectToObject(j, "prompt_tokens_details");
  cJSON_AddNumberToObject(d, "cached_tokens", u->cached_prompt_tokens);
  return j;
}

/* S (n bytes) as valid UTF-8 in OUT (cap >= 3n + 1): invalid or partial sequences become U+FFFD
 * (a token's own bytes may split a character; the "bytes" field keeps them exactly). */
static void utf8_sanitize(const char *s, int n, char *out) {
  const unsigned char *u = (const unsigned char *)s;
  int o = 0;
  for (int i = 0; i < n;) {
    int len = u[i] < 0x80 ? 1 : (u[i] >> 5) == 6 ? 2 : (u[i] >> 4) == 14 ? 3 : (u[i] >> 3) == 30 ? 4 : 0;
    int ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; k++)
      ok = (u[i + k] & 0xC0) == 0x80;
    if (ok) {
      memcpy(out + o, s + i, (size_t)len);
      o += len;
      i += len;
    } else {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i++;
    }
  }
  out[o] = 0;
}

static cJSON *bytes_json(const char *s, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++)
    cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
  return a;
}

/* Logprob entries of one event; into *DST (created on first use) in the endpoint's format. */
static void add_logprobs(struct job *J, struct choice *c, const struct pagoda_event *ev, cJSON **dst) {
  char piece[256];
  for (int i = 0; i < ev->num_token_ids; i++) {
    int pl = pagoda_token_piece(J->S->e, ev->token_ids[i], piece, sizeof piece);
    if (pl < 0)
      pl = 0;
    char spiece[3 * sizeof piece + 1];
    utf8_sanitize(piece, pl, spiece);
    if (J->chat) {
      if (!*dst)
        *dst = cJSON_CreateArray();
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "token", spiece);
      cJSON_AddNumberToObject(e, "logprob", ev->logprobs[i]);
      cJSON_AddItemToObject(e, "bytes", bytes_json(piece, pl));
      cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
      for (int k = 0; k < ev->num_top_logprobs; k++) {
        char tp[256];
        int tl = pagoda_token_piece(J->S->e, ev->top_logprob_ids[i * ev->num_top_logprobs + k], tp, sizeof tp);
        char stp[3 * sizeof tp + 1];
        utf8_sanitize(tp, tl > 0 ? tl : 0, stp);
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "token", stp);
        cJSON_AddNumberToObject(t, "logprob", ev->top_logprobs[i * ev->num_top_logprobs + k]);
        cJSON_AddItemToObject(t, "bytes", bytes_json(tp, tl > 0 ? tl : 0));
        cJSON_AddItemToArray(top, t);
      }
      cJSON_AddItemToArray(*dst, e);
    } else {
      if (!*dst) {
        *dst = cJSON_CreateObject();
        cJSON_AddArrayToObject(*dst, "tokens");
        cJSON_AddArrayToObject(*dst, "token_logprobs");
        cJSON_AddArrayToObject(*dst, "top_logprobs");
        cJSON_AddArrayToObject(*dst, "text_offset");
      }
      cJSON_AddItemToArray(cJSON_GetObjectItem(*dst, "tokens"), cJSON_CreateString(spiece));
      cJSON_AddItemToArray(cJSON_GetObjectItem(*dst, "token_logprobs"), cJSON_CreateNumber(ev->logprobs[i]));
      cJSON *top = cJSON_CreateObject();
      for (int k = 0; k < ev->num_top_logprobs; k++) {
        char tp[256], stp[3 * sizeof tp + 1];
        int tl = pagoda_token_piece(J->S->e, ev->top_logprob_ids[i * ev->num_top_logprobs + k], tp, sizeof tp);
        utf8_sanitize(tp, tl > 0 ? tl : 0, stp);
        if (!cJSON_GetObjectItemCaseSensitive(top, stp))
          cJSON_AddNumberToObject(top, stp, ev->top_logprobs[i * ev->num_top_logprobs + k]);
      }
      cJSON_AddItemToArray(cJSON_GetObjectItem(*dst, "top_logprobs"), top);
      cJSON_AddItemToArray(cJSON_GetObjectItem(*dst, "text_offset"), cJSON_CreateNumber((double)c->text.len));
    }
  }
}

static cJSON *chunk_base(struct job *J) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "id", J->id);
  cJSON_AddStringToObject(j, "object", J->chat ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(j, "created", (double)J->created);
  cJSON_AddStringToObject(j, "model", J->S->cfg->model_name);
  return j;
}

static void sse(struct job *J, cJSON *j) {
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  buf_str(&J->out, "data: ");
  buf_str(&J->out, s);
  buf_str(&J->out, "\n\n");
  cJSON_free(s);
}

/* Streaming chunk for choice IDX: text delta, logprobs, optional tool calls and finish. */
static void stream_chunk(struct job *J, int idx, const char *text, size_t len, cJSON *lp, cJSON *tool_calls,
                         const char *finish) {
  struct choice *c = &J->ch[idx];
  cJSON *j = chunk_base(J), *choices = cJSON_AddArrayToObject(j, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddNumberToObject(ch, "index", idx);
  if (J->chat) {
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    if (!c->role_sent) {
      cJSON_AddStringToObject(d, "role", "assistant");
      c->role_sent = 1;
    }
    if (len || (!tool_calls && !finish)) /* the last chunk's delta is {} (no empty content) */
      cJSON_AddItemToObject(d, "content", json_string_n(text, len)); /* NUL bytes as \u0000 */
    if (tool_calls)
      cJSON_AddItemToObject(d, "tool_calls", tool_calls);
    if (lp) {
      cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
      cJSON_AddItemToObject(l, "content", lp);
    } else {
      cJSON_AddNullToObject(ch, "logprobs");
    }
  } else {
    cJSON_AddItemToObject(ch, "text", json_string_n(text, len));
    if (lp)
      cJSON_AddItemToObject(ch, "logprobs", lp);
    else
      cJSON_AddNullToObject(ch, "logprobs");
  }
  if (finish)
    cJSON_AddStringToObject(ch, "finish_reason", finish);
  else
    cJSON_AddNullToObject(ch, "finish_reason");
  cJSON_AddItemToArray(choices, ch);
  if (J->include_usage)
    cJSON_AddNullToObject(j, "usage");
  sse(J, j);
}

static void note_timing(struct job *J, const struct pagoda_event *ev) {
  double t = now_s();
  if (ev->num_token_ids > 0) {
    if (!J->first_seen) {
      J->first_seen = 1;
      J->t_first = t;
    } else {
      hist_add(&J->itl, t - J->t_last);
    }
    J->t_last = t;
  }
}

/* Numbers CALLS (a tool_calls array) of choice IDX on from its count: "index" and a request-unique
 * id (the choice is part of it: with n > 1 every choice has its own calls). */
static void name_calls(struct job *J, int idx, int *count, cJSON *calls) {
  cJSON *it;
  cJSON_ArrayForEach(it, calls) {
    char id[112];
    snprintf(id, sizeof id, "call_%s_%d_%d", J->id, idx, *count);
    cJSON_ReplaceItemInObjectCaseSensitive(it, "id", cJSON_CreateString(id));
    if (J->stream)
      cJSON_AddNumberToObject(it, "index", *count);
    (*count)++;
  }
}

/* Streaming: CALLS of choice IDX in one delta.tool_calls chunk (takes ownership). */
static void emit_calls(struct job *J, int idx, cJSON *calls) {
  name_calls(J, idx, &J->ch[idx].num_calls, calls);
  stream_chunk(J, idx, "", 0, NULL, calls, NULL);
}

/* Takes one event of prompt P. */
static void job_event(struct job *J, int p, const struct pagoda_event *ev) {
  if (ev->index < 0 || ev->index >= J->stride)
    return;
  int idx = p * J->stride + ev->index;
  struct choice *c = &J->ch[idx];
  note_timing(J, ev);
  c->ntok += ev->num_token_ids;
  size_t before = c->text.len;
  cJSON *lp = NULL;
  if (ev->logprobs)
    add_logprobs(J, c, ev, J->stream ? &lp : &c->lp);
  buf_add(&c->text, ev->text, ev->text_len);
  if (ev->finish_reason) {
    c->finish = ev->finish_reason;
    J->usage = ev->usage; /* of the whole request: every sample */
  }
  if (!J->stream)
    return;
  const char *fin = ev->finish_reason ? finish_name(ev->finish_reason) : NULL;
  if (!J->tools) {
    stream_chunk(J, idx, c->text.p + before, c->text.len - before, lp, NULL, fin);
    c->sent = c->text.len;
    return;
  }
  /* Tools: content streams until a call may begin; a Hermes call goes out as soon as its
   * </tool_call> closes; what remains (and the other formats' calls) when the output ends. */
  enum tool_format f = J->S->tool_fmt;
  const char *t = c->text.p ? c->text.p : "";
  size_t len = c->text.len;
  size_t safe = tool_content_safe(f, t, len);
  if (c->num_calls == 0 && safe > c->sent) {
    stream_chunk(J, idx, t + c->sent, safe - c->sent, lp, NULL, NULL);
    lp = NULL;
    c->sent = safe;
  }
  if (f == TOOL_FMT_HERMES) {
    if (!c->have_from) {
      const char *m = memmem(t, len, "<tool_call>", 11);
      if (m) {
        c->have_from = 1;
        c->calls_from = (size_t)(m - t);
      }
    }
    const char *e;
    while (c->have_from && (e = memmem(t + c->calls_from, len - c->calls_from, "</tool_call>", 12))) {
      size_t stop = (size_t)(e - t) + 12, ce;
      cJSON *x = tool_calls_parse(f, t + c->calls_from, stop - c->calls_from, &ce);
      if (x)
        emit_calls(J, idx, x);
      c->calls_from = stop;
    }
  }
  if (ev->finish_reason) {
    size_t ce;
    if (c->num_calls == 0) { /* the whole output: content up to the first call, then the calls */
      cJSON *x = tool_calls_parse(f, t, len, &ce);
      size_t cend = x ? ce : len;
      if (cend > c->sent) {
        stream_chunk(J, idx, t + c->sent, cend - c->sent, lp, NULL, NULL);
        lp = NULL;
        c->sent = cend;
      }
      if (x)
        emit_calls(J, idx, x);
    } else if (c->calls_from < len) { /* after the last closed Hermes block */
      cJSON *x = tool_calls_parse(f, t + c->calls_from, len - c->calls_from, &ce);
      if (x)
        emit_calls(J, idx, x);
    }
    if (c->num_calls > 0 && ev->finish_reason == PAGODA_FINISH_STOP)
      fin = "tool_calls";
    stream_chunk(J, idx, "", 0, lp, NULL, fin);
  } else if (lp) {
    stream_chunk(J, idx, "", 0, lp, NULL, NULL);
  }
}

static void record_metrics(struct job *J) {
  struct server *S = J->S;
  double t = now_s();
  pthread_mutex_lock(&S->mu);
  if (J->first_seen) {
    hist_add(&S->ttft, J->t_first - J->t_start);
    int ntok = 0;
    for (int i = 0; i < J->num_prompts * J->stride; i++)
      ntok += J->ch[i].ntok;
    if (ntok > 1)
      hist_add(&S->tpot, (J->t_last - J->t_first) / (ntok - 1));
  }
  hist_add(&S->e2e, t - J->t_start);
  for (int i = 0; i <= HIST_BUCKETS; i++)
    S->itl.counts[i] += J->itl.counts[i];
  S->itl.sum += J->itl.sum;
  S->itl.n += J->itl.n;
  for (int i = 0; i < J->num_prompts * J->stride; i += J->stride) {
    int f = J->ch[i].finish;
    if (f >= 1 && f <= 3)
      S->req_ok[f - 1]++;
  }
  S->prompt_tokens += J->usage.prompt_tokens;
  S->generation_tokens += J->usage.completion_tokens;
  pthread_mutex_unlock(&S->mu);
}

/* The whole non-streaming response. */
static cJSON *final_response(struct job *J, struct pagoda_usage *total) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "id", J->id);
  cJSON_AddStringToObject(j, "object", J->chat ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(j, "created", (double)J->created);
  cJSON_AddStringToObject(j, "model", J->S->cfg->model_name);
  cJSON *choices = cJSON_AddArrayToObject(j, "choices");
  for (int i = 0; i < J->num_prompts * J->n; i++) {
    struct choice *c = &J->ch[(i / J->n) * J->stride + i % J->n];
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    const char *fin = finish_name(c->finish);
    if (J->chat) {
      cJSON *m = cJSON_AddObjectToObject(ch, "message");
      cJSON_AddStringToObject(m, "role", "assistant");
      size_t content_end = c->text.len;
      cJSON *calls = J->tools ? tool_calls_parse(J->S->tool_fmt, c->text.p ? c->text.p : "", c->text.len, &content_end)
                              : NULL;
      if (calls && content_end == 0)
        cJSON_AddNullToObject(m, "content");
      else
        cJSON_AddItemToObject(m, "content", json_string_n(c->text.p ? c->text.p : "", content_end));
      if (calls) {
        name_calls(J, i, &c->num_calls, calls);
        cJSON_AddItemToObject(m, "tool_calls", calls);
        if (c->finish == PAGODA_FINISH_STOP)
          fin = "tool_calls";
      }
      if (c->lp) {
        cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
        cJSON_AddItemToObject(l, "content", c->lp);
        c->lp = NULL;
      } else {
        cJSON_AddNullToObject(ch, "logprobs");
      }
    } else {
      struct buf t = {0};
      int p = i / J->n;
      if (J->echo && J->prompt_text[p])
        buf_str(&t, J->prompt_text[p]);
      if (c->text.len)
        buf_add(&t, c->text.p, c->text.len);
      cJSON_AddItemToObject(ch, "text", json_string_n(t.p ? t.p : "", t.len));
      free(t.p);
      if (c->lp) {
        cJSON_AddItemToObject(ch, "logprobs", c->lp);
        c->lp = NULL;
      } else {
        cJSON_AddNullToObject(ch, "logprobs");
      }
    }
    cJSON_AddStringToObject(ch, "finish_reason", fin ? fin : "stop");
    cJSON_AddItemToArray(choices, ch);
  }
  cJSON_AddItemToObject(j, "usage", usage_json(total));
  return j;
}

/* Streaming body: called by libmicrohttpd whenever the socket can take more. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *out, size_t max) {
  (void)pos;
  struct job *J = cls;
  while (J->out_pos == J->out.len) {
    J->out.len = J->out_pos = 0;
    if (J->done)
      return MHD_CONTENT_READER_END_OF_STREAM;
    struct pagoda_event ev;
    int st = pagoda_stream_next(J->streams[0], &ev, 15000);
    if (st == PAGODA_OK) {
      job_event(J, 0, &ev);
    } else if (st == PAGODA_ERR_TIMEOUT) {
      buf_str(&J->out, ": keep-alive\n\n");
    } else {
      if (J->include_usage) {
        cJSON *j = chunk_base(J);
        cJSON_AddArrayToObject(j, "choices");
        cJSON_AddItemToObject(j, "usage", usage_json(&J->usage));
        sse(J, j);
      }
      buf_str(&J->out, "data: [DONE]\n\n");
      J->done = 1;
      record_metrics(J);
    }
  }
  size_t n = J->out.len - J->out_pos;
  if (n > max)
    n = max;
  memcpy(out, J->out.p + J->out_pos, n);
  J->out_pos += n;
  return (ssize_t)n;
}

/* The client is gone or the response is complete: free (= abort) the streams. */
static void stream_free_cb(void *cls) {
  struct job *J = cls;
  if (!J->done) { /* the client left mid-stream: counted as aborted */
    for (int i = 0; i < J->num_prompts * J->stride; i++)
      if (!J->ch[i].finish)
        J->ch[i].finish = PAGODA_FINISH_ABORT;
    record_metrics(J);
  }
  job_free(J);
}

/* 1 when the client of CONN closed its side (non-streaming requests poll this while they wait:
 * libmicrohttpd only notices a gone client when it writes). Peeks, never consumes. */
static int client_gone(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci)
    return 0;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0)
    return 0;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP))
    return 1;
  char c;
  return (p.revents & POLLIN) && recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static unsigned submit_status(int st) {
  switch (st) {
  case PAGODA_ERR_BUSY: return 429;
  case PAGODA_ERR_CLOSED: return 503;
  case PAGODA_ERR_INVALID_ARG:
  case PAGODA_ERR_TOO_LONG:
  case PAGODA_ERR_UNSUPPORTED: return 400;
  default: return 500;
  }
}

static enum MHD_Result handle_completion(struct server *S, struct MHD_Connection *conn, const cJSON *req, int chat) {
  struct job *J = calloc(1, sizeof *J);
  struct perr pe = {0};
  J->S = S;
  J->chat = chat;
  J->t_start = now_s();
  J->created = (long)time(NULL);
  pthread_mutex_lock(&S->mu);
  uint64_t seq = ++S->next_id;
  pthread_mutex_unlock(&S->mu);
  snprintf(J->id, sizeof J->id, "%s-%llx%08llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)J->created,
           (unsigned long long)seq);
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(req, "model");
  int bad = 0;
  if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, S->cfg->model_name))) {
    fail(&pe, 404, "model", "The model `%s` does not exist (this server serves `%s`).",
         cJSON_IsString(model) ? model->valuestring : "?", S->cfg->model_name);
    bad = 1;
  }
  if (!bad)
    bad = parse_sampling(J, req, &pe) != 0;
  if (!bad && chat) {
    char *prompt = NULL;
    bad = parse_messages(J, req, &pe, &prompt) != 0;
    if (!bad) {
      alloc_prompts(J, 1);
      bad = tokenize_prompt(J, 0, prompt, 1, &pe) != 0;
    }
    free(prompt);
  } else if (!bad) {
    bad = parse_completion_prompt(J, req, &pe) != 0;
    if (!bad && get_bool(req, "echo", &J->echo, &pe))
      bad = 1;
    if (!bad && J->echo && J->stream)
      bad = fail(&pe, 400, "echo", "'echo' cannot be streamed") != 0;
  }
  if (bad) {
    job_free(J);
    return send_error(S, conn, pe.status, pe.param, "%s", pe.msg);
  }
  J->stride = J->sp.beam_width > 1 ? J->sp.beam_width : J->n;
  J->ch = calloc((size_t)(J->num_prompts * J->stride), sizeof *J->ch);
  for (int p = 0; p < J->num_prompts; p++) {
    int st = pagoda_async_submit(S->async, NULL, J->ids[p], J->n_ids[p], &J->sp, &J->streams[p]);
    if (st != PAGODA_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", pagoda_last_error());
      job_free(J);
      return send_error(S, conn, submit_status(st), st == PAGODA_ERR_TOO_LONG ? "prompt" : NULL, "%s", msg);
    }
  }
  if (J->stream) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, J, stream_free_cb);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    enum MHD_Result rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&S->mu);
    S->http_by_class[2]++;
    pthread_mutex_unlock(&S->mu);
    return rc;
  }
  struct pagoda_usage total = {0};
  for (int p = 0; p < J->num_prompts; p++) {
    struct pagoda_event ev;
    int st;
    double checked = now_s();
    while ((st = pagoda_stream_next(J->streams[p], &ev, 200)) != PAGODA_ERR_NOT_FOUND) {
      if (st == PAGODA_OK)
        job_event(J, p, &ev);
      if (now_s() - checked >= 0.2) { /* every 0.2 s, events or not */
        checked = now_s();
        if (client_gone(conn)) /* abort everything; the events still arrive (finish = abort) */
          for (int q = 0; q < J->num_prompts; q++)
            pagoda_stream_abort(J->streams[q]);
      }
    }
    total.prompt_tokens += J->usage.prompt_tokens;
    total.completion_tokens += J->usage.completion_tokens;
    total.cached_prompt_tokens += J->usage.cached_prompt_tokens;
    memset(&J->usage, 0, sizeof J->usage);
  }
  J->usage = total;
  record_metrics(J);
  cJSON *resp = final_response(J, &total);
  job_free(J);
  return send_json(S, conn, 200, resp);
}

static enum MHD_Result handle_tokenize(struct server *S, struct MHD_Connection *conn, const cJSON *req) {
  struct job *J = calloc(1, sizeof *J);
  struct perr pe = {0};
  J->S = S;
  int add_special = 1, bad = 0;
  char *text = NULL;
  int chat = 0;
  if (cJSON_GetObjectItemCaseSensitive(req, "messages")) {
    J->chat = 1;
    chat = 1;
    bad = parse_messages(J, req, &pe, &text) != 0;
  } else {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (!cJSON_IsString(p))
      bad = fail(&pe, 400, "prompt", "/tokenize takes {\"prompt\": string} or {\"messages\": [...]}") != 0;
    else
      text = strdup(p->valuestring);
  }
  if (!bad && get_bool(req, "add_special_tokens", &add_special, &pe))
    bad = 1;
  cJSON *out = NULL;
  if (!bad) {
    size_t len = strlen(text);
    int cap = (int)(len + 16);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = pagoda_tokenize(S->e, text, len, chat ? 0 : add_special, chat, ids, cap);
    if (n < 0 || n > cap) {
      bad = fail(&pe, 400, "prompt", "the text could not be tokenized") != 0;
    } else {
      out = cJSON_CreateObject();
      cJSON_AddNumberToObject(out, "count", n);
      cJSON_AddNumberToObject(out, "max_model_len", pagoda_max_model_len(S->e));
      cJSON_AddItemToObject(out, "tokens", cJSON_CreateIntArray((const int *)ids, n));
    }
    free(ids);
  }
  free(text);
  job_free(J);
  if (bad)
    return send_error(S, conn, pe.status, pe.param, "%s", pe.msg);
  return send_json(S, conn, 200, out);
}

static enum MHD_Result handle_detokenize(struct server *S, struct MHD_Connection *conn, const cJSON *req) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tokens");
  if (!cJSON_IsArray(t))
    return send_error(S, conn, 400, "tokens", "/detokenize takes {\"tokens\": [ids]}");
  int n = cJSON_GetArraySize(t), k = 0;
  int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
  const cJSON *it;
  cJSON_ArrayForEach(it, t) {
    int vocab = pagoda_vocab_size(S->e);
    if (int_in_range(it, 0, vocab, &ids[k])) {
      free(ids);
      return send_error(S, conn, 400, "tokens", "'tokens' must be an array of integer token ids in [0, %d)", vocab);
    }
    k++;
  }
  char *text;
  size_t len;
  int st = pagoda_detokenize(S->e, ids, k, 1, &text, &len);
  free(ids);
  if (st != PAGODA_OK)
    return send_error(S, conn, 400, "tokens", "%s", pagoda_last_error());
  cJSON *out = cJSON_CreateObject();
  cJSON_AddItemToObject(out, "prompt", json_string_n(text, len)); /* NUL bytes kept as \u0000 */
  free(text);
  return send_json(S, conn, 200, out);
}

static enum MHD_Result handle_metrics(struct server *S, struct MHD_Connection *conn) {
  struct pagoda_async_stats st;
  pagoda_async_stats(S->async, &st);
  struct buf b = {0};
  const struct pagoda_engine_stats *e = &st.engine;
#define GAUGE(name, help, fmt, val) buf_fmt(&b, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " " fmt "\n", val)
#define COUNTER(name, help, val) \
  buf_fmt(&b, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %lld\n", (long long)(val))
  GAUGE("pagoda:num_requests_running", "Sequences in the running batch.", "%d", e->running);
  GAUGE("pagoda:num_requests_waiting", "Sequences waiting for admission.", "%d", e->waiting);
  GAUGE("pagoda:num_requests_queued", "Submitted requests without a first token yet.", "%d", st.queued);
  GAUGE("pagoda:kv_cache_usage_perc", "Fraction of KV blocks referenced (1 = full).", "%.6f", e->kv_usage);
  GAUGE("pagoda:kv_blocks_used", "KV blocks referenced by sequences.", "%d", e->num_blocks - e->free_blocks);
  GAUGE("pagoda:kv_blocks_total", "Usable KV blocks in the pool.", "%d", e->num_blocks);
  COUNTER("pagoda:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", e->prefix_queries);
  COUNTER("pagoda:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", e->prefix_hits);
  COUNTER("pagoda:num_preemptions_total", "Sequences preempted for lack of KV blocks.", e->preemptions);
  pthread_mutex_lock(&S->mu);
  COUNTER("pagoda:prompt_tokens_total", "Prompt tokens of finished requests.", S->prompt_tokens);
  COUNTER("pagoda:generation_tokens_total", "Generated tokens of finished requests.", S->generation_tokens);
  buf_fmt(&b, "# HELP pagoda:request_success_total Finished requests by finish reason.\n"
              "# TYPE pagoda:request_success_total counter\n");
  static const char *names[3] = {"stop", "length", "abort"};
  for (int i = 0; i < 3; i++)
    buf_fmt(&b, "pagoda:request_success_total{finished_reason=\"%s\"} %lld\n", names[i], (long long)S->req_ok[i]);
  buf_fmt(&b, "# HELP pagoda:http_responses_total HTTP responses by status class.\n"
              "# TYPE pagoda:http_responses_total counter\n");
  for (int i = 2; i < 6; i++)
    buf_fmt(&b, "pagoda:http_responses_total{code=\"%dxx\"} %lld\n", i, (long long)S->http_by_class[i]);
  hist_print(&b, "pagoda:time_to_first_token_seconds", "Time from request arrival to its first token.", &S->ttft);
  hist_print(&b, "pagoda:time_per_output_token_seconds", "Mean time between output tokens of a request.", &S->tpot);
  hist_print(&b, "pagoda:inter_token_latency_seconds", "Time between successive outputs of a request.", &S->itl);
  hist_print(&b, "pagoda:e2e_request_latency_seconds", "Time from request arrival to its end.", &S->e2e);
  pthread_mutex_unlock(&S->mu);
  COUNTER("pagoda:engine_steps_total", "Engine steps.", e->steps);
  COUNTER("pagoda:requests_rejected_busy_total", "Requests refused with 429 (waiting queue full).", st.rejected_busy);
#undef GAUGE
#undef COUNTER
  enum MHD_Result rc = send_text(S, conn, 200, "text/plain; version=0.0.4", b.p, b.len);
  free(b.p);
  return rc;
}

static enum MHD_Result handle_models(struct server *S, struct MHD_Connection *conn) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "object", "list");
  cJSON *data = cJSON_AddArrayToObject(j, "data"), *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", S->cfg->model_name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "pagoda");
  cJSON_AddNumberToObject(m, "max_model_len", pagoda_max_model_len(S->e));
  cJSON_AddNumberToObject(m, "vocab_size", pagoda_vocab_size(S->e));
  cJSON_AddItemToArray(data, m);
  return send_json(S, conn, 200, j);
}

/* ---- dispatch ---- */

struct conn_ctx {
  struct buf body;
  int too_large;
};

static int authorized(struct server *S, struct MHD_Connection *conn) {
  if (!S->cfg->api_key)
    return 1;
  const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  if (!h || strncasecmp(h, "Bearer ", 7)) /* the scheme is case-insensitive (RFC 9110) */
    return 0;
  const char *k = h + 7, *want = S->cfg->api_key;
  size_t n = strlen(want);
  if (strlen(k) != n)
    return 0;
  unsigned char diff = 0; /* constant time in the key's length */
  for (size_t i = 0; i < n; i++)
    diff |= (unsigned char)(k[i] ^ want[i]);
  return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  struct server *S = cls;
  struct conn_ctx *ctx = *con_cls;
  if (!ctx) {
    ctx = calloc(1, sizeof *ctx);
    *con_cls = ctx;
    pthread_mutex_lock(&S->mu);
    S->inflight++;
    pthread_mutex_unlock(&S->mu);
    /* An oversized body is refused from its header, before any of it is read. */
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
      char *end;
      errno = 0;
      unsigned long long n = strtoull(cl, &end, 10);
      if (end != cl && (errno == ERANGE || n > S->cfg->max_body)) {
        ctx->too_large = 1;
        return send_error(S, conn, 413, NULL, "the request body (Content-Length %s) is larger than %zu bytes (--max-body-mb)",
                          cl, S->cfg->max_body);
      }
    }
    return MHD_YES;
  }
  if (*upload_size) {
    if (ctx->body.len + *upload_size > S->cfg->max_body) {
      /* A chunked body (no Content-Length) past the limit: libmicrohttpd cannot queue a response
       * in the middle of an upload, so the connection is closed rather than read on. */
      fprintf(stderr, "pagoda serve: a %s %s body grew past --max-body-mb (%zu bytes): connection closed\n", method,
              url, S->cfg->max_body);
      return MHD_NO;
    }
    buf_add(&ctx->body, upload, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  if (ctx->too_large) /* the 413 is queued already */
    return MHD_YES;
  int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  if (!strcmp(method, "OPTIONS")) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    enum MHD_Result rc = MHD_queue_response(conn, 204, r);
    MHD_destroy_response(r);
    return rc;
  }
  if (!strcmp(url, "/") || !strcmp(url, "/index.html")) {
    if (!get)
      return send_error(S, conn, 405, NULL, "use GET for %s", url);
    return send_text(S, conn, 200, "text/html; charset=utf-8", (const char *)pagoda_chat_page, pagoda_chat_page_len);
  }
  if (!strcmp(url, "/health")) {
    if (!get)
      return send_error(S, conn, 405, NULL, "use GET for %s", url);
    struct pagoda_async_stats st;
    pagoda_async_stats(S->async, &st);
    if (!st.accepting)
      return send_error(S, conn, 503, NULL, "the server is shutting down");
    if (st.step_failures > 0)
      return send_error(S, conn, 503, NULL, "the engine failed %lld step(s); see the server log",
                        (long long)st.step_failures);
    return send_text(S, conn, 200, "application/json", "{\"status\":\"ok\"}", 15);
  }
  if (!strcmp(url, "/metrics")) {
    if (!get)
      return send_error(S, conn, 405, NULL, "use GET for %s", url);
    return handle_metrics(S, conn);
  }
  int v1 = !strncmp(url, "/v1/", 4);
  int known = !strcmp(url, "/v1/models") || !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions") ||
              !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize");
  if (!known)
    return send_error(S, conn, 404, NULL, "no such endpoint: %s %s", method, url);
  if ((v1 || S->cfg->api_key) && !authorized(S, conn))
    return send_error(S, conn, 401, NULL, "missing or wrong API key: send the header 'Authorization: Bearer KEY'");
  if (!strcmp(url, "/v1/models")) {
    if (!get)
      return send_error(S, conn, 405, NULL, "use GET for %s", url);
    return handle_models(S, conn);
  }
  if (!post)
    return send_error(S, conn, 405, NULL, "use POST for %s", url);
  const char *parse_end = NULL;
  cJSON *req = ctx->body.p ? cJSON_ParseWithOpts(ctx->body.p, &parse_end, 1) : NULL;
  size_t off = parse_end && ctx->body.p ? (size_t)(parse_end - ctx->body.p) : 0;
  if (req && off != ctx->body.len) { /* cJSON stops at a NUL byte: what follows it is not JSON */
    cJSON_Delete(req);
    req = NULL;
  }
  if (!req)
    return send_error(S, conn, 400, NULL, "the body is not valid JSON (at byte %zu)", off);
  long nul = json_nul_escape(ctx->body.p, ctx->body.len);
  if (nul >= 0) {
    cJSON_Delete(req);
    return send_error(S, conn, 400, NULL,
                      "a JSON string holds a NUL character (\\u0000 at byte %ld): NUL is not supported in requests",
                      nul);
  }
  if (!cJSON_IsObject(req)) {
    cJSON_Delete(req);
    return send_error(S, conn, 400, NULL, "the body must be a JSON object");
  }
  enum MHD_Result rc;
  if (!strcmp(url, "/v1/completions"))
    rc = handle_completion(S, conn, req, 0);
  else if (!strcmp(url, "/v1/chat/completions"))
    rc = handle_completion(S, conn, req, 1);
  else if (!strcmp(url, "/tokenize"))
    rc = handle_tokenize(S, conn, req);
  else
    rc = handle_detokenize(S, conn, req);
  cJSON_Delete(req);
  return rc;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)conn;
  (void)toe;
  struct server *S = cls;
  struct conn_ctx *ctx = *con_cls;
  if (ctx) {
    free(ctx->body.p);
    free(ctx);
    *con_cls = NULL;
    pthread_mutex_lock(&S->mu);
    if (--S->inflight == 0)
      pthread_cond_broadcast(&S->idle);
    pthread_mutex_unlock(&S->mu);
  }
}

int server_run(const struct pagoda_engine_params *ep, const struct server_config *cfg) {
  /* SIGINT/SIGTERM are taken by sigwait below: blocked in every thread started from here. */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  struct server S = {0};
  S.cfg = cfg;
  pthread_mutex_init(&S.mu, NULL);
  pthread_cond_init(&S.idle, NULL);
  struct pagoda_async_params ap;
  pagoda_async_params_default(&ap);
  if (cfg->max_waiting > 0)
    ap.max_waiting = cfg->max_waiting;
  if (pagoda_async_create(ep, &ap, &S.async) != PAGODA_OK) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    return 1;
  }
  S.e = pagoda_async_engine(S.async);
  S.tmpl = cfg->chat_template ? cfg->chat_template : pagoda_chat_template(S.e);
  S.tool_fmt = tool_format_from_template(S.tmpl);
  if (S.tmpl) { /* a template that cannot render one user message is the server's fault (500), not the client's */
    char *probe = NULL;
    if (pagoda_render_chat_ext(S.e, S.tmpl, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 1, &probe) != PAGODA_OK) {
      snprintf(S.tmpl_fault, sizeof S.tmpl_fault, "the server's chat template is broken: %s", pagoda_last_error());
      fprintf(stderr, "pagoda serve: warning: %s (chat requests get 500; fix it with --chat-template FILE)\n",
              S.tmpl_fault);
    }
    free(probe);
  }

  struct sockaddr_in addr = {0};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)cfg->port);
  if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) {
    fprintf(stderr, "error: --host %s is not an IPv4 address\n", cfg->host);
    pagoda_async_free(S.async);
    return 2;
  }
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request,
      &S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &S,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, /* idle connections close: they hold a thread */
      MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
  if (!d) {
    fprintf(stderr, "error: cannot listen on %s:%d (in use? change --port)\n", cfg->host, cfg->port);
    pagoda_async_free(S.async);
    return 1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  int port = info ? info->port : cfg->port;
  struct pagoda_async_stats st;
  pagoda_async_stats(S.async, &st);
  const char *cache = ep->prefix_cache_n == 0 ? "prefix cache off"
                      : st.engine.paged      ? "prefix cache: block-level (PagedAttention)"
                                             : "prefix cache: sequence-level (contiguous KV)";
  fprintf(stderr, "pagoda serve: model '%s', %d KV blocks of %d tokens, %s, chat template %s, tool-call format %s\n",
           cfg->model_name, st.engine.num_blocks, st.engine.block_size, cache,
           S.tmpl ? (cfg->chat_template ? "from --chat-template" : "from the model") : "none",
           S.tool_fmt == TOOL_FMT_MISTRAL ? "mistral" : S.tool_fmt == TOOL_FMT_LLAMA3 ? "llama3-json" : "hermes");
  fprintf(stderr, "pagoda serve: listening on http://%s:%d\n", cfg->host, port);
  fflush(stderr);

  int sig = 0;
  sigwait(&sigs, &sig);
  fprintf(stderr, "pagoda serve: %s received: finishing running requests (grace %d ms)\n",
          sig == SIGINT ? "SIGINT" : "SIGTERM", cfg->grace_ms);
  MHD_socket lfd = MHD_quiesce_daemon(d); /* no new connections */
  if (lfd != MHD_INVALID_SOCKET)
    close(lfd);
  pagoda_async_shutdown(S.async, cfg->grace_ms);
  /* Every request has ended in the engine; let the responses finish sending (5 s at most). */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  pthread_mutex_lock(&S.mu);
  while (S.inflight > 0 && pthread_cond_timedwait(&S.idle, &S.mu, &until) == 0)
    ;
  pthread_mutex_unlock(&S.mu);
  MHD_stop_daemon(d);
  pthread_cond_destroy(&S.idle);
  pagoda_async_free(S.async);
  pthread_mutex_destroy(&S.mu);
  fprintf(stderr, "pagoda serve: stopped\n");
  return 0;
}
