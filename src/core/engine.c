/* engine.c - the engine behind include/pagoda.h, part 4 of 4: adding and aborting requests,
 * and the text helpers (tokenize, chat templates, detokenize). Creation is engine_create.c,
 * the step engine_step.c, outputs and stats engine_output.c; engine_impl.h says what the
 * engine holds. Memory: a request allocates its sequences (tokens, tables) when added;
 * nothing is allocated per token apart from the amortized growth of its output text. */
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/engine_impl.h"
#include "text/chat_template.h"
#include "util/log.h"

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
  int num_new = sp.beam_width > 1 ? sp.beam_width : sp.n;
  int need = e->num_dirty + num_new + 1; /* outputs a step can report are bounded by live sequences */
  int live_seqs = 0;
  for (struct request *r = e->live; r; r = r->next)
    live_seqs += r->num_seqs;
  if (need < live_seqs + num_new)
    need = live_seqs + num_new;
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
  struct request *r = request_create(e->next_id + 1, ids, n, max_tokens, &sp, &e->kv, e->tok, e->eog, e->num_eog);
  if (!r)
    return PAGODA_ERR_OUT_OF_MEMORY;
  r->t_arrival = now_s();
  r->sync_steps = engine_request_sync_steps(r);
  e->num_sync_reqs += r->sync_steps;
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

void engine_mark_dirty(struct pagoda_engine *e, struct sequence *s) {
  if (!s->dirty) {
    s->dirty = 1;
    e->dirty[e->num_dirty++] = s;
  }
}

void engine_finish_seq(struct pagoda_engine *e, struct sequence *s) {
  if (s->pend) { /* (an abort) the placeholder of a launched step's token goes, unreported */
    s->pend = 0;
    s->s.num_tokens--;
  }
  if (s->s.state != SCHED_NONE)
    scheduler_remove(&e->sched, &s->s);
  s->req->num_live--;
  engine_mark_dirty(e, s);
}

int pagoda_abort(pagoda_engine_t *e, uint64_t id) {
  for (struct request *r = e->live; r; r = r->next) {
    if (r->id != id || r->num_live == 0)
      continue;
    for (int i = 0; i < r->num_seqs; i++) {
      struct sequence *s = &r->seqs[i];
      if (s->finish)
        continue;
      s->finish = PAGODA_FINISH_ABORT;
      engine_finish_seq(e, s);
    }
    return PAGODA_OK;
  }
  return ERR("no running request with id %llu", (unsigned long long)id), PAGODA_ERR_NOT_FOUND;
}

int pagoda_engine_has_work(const pagoda_engine_t *e) {
  return scheduler_has_work(&e->sched) || e->num_dirty > 0 || e->flight[0].active || e->flight[1].active;
}


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

