/* engine_step.c - pagoda_engine_step: schedule, run the batch, postprocess (sampling, forks,
 * beams, stop conditions), then report. See engine_impl.h. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/beam.h"
#include "core/engine_impl.h"
#include "util/log.h"

static int is_fork_row(const struct sequence *s);

/* The logprob of SEQ's last token: from device entry DEV (its values came back from topk_rows),
 * or from the raw row saved in FROM on the host (DEV < 0). */
static void record_logprob(struct pagoda_engine *e, struct sequence *seq, const struct sequence *from, int dev) {
  if (dev < 0)
    sequence_record_logprob(seq, from, e->vocab);
  else
    sequence_set_logprob(seq, e->ds_tlp[dev], e->ds_top_ids + (size_t)dev * BACKEND_TOPK_MAX,
                         e->ds_top_lp + (size_t)dev * BACKEND_TOPK_MAX);
}

/* Samples 1..n-1 of SEQ's request start from SEQ's state after the prompt: they share its blocks
 * (ref counts) and each draws its first token from the same logits with its own generator. DEV
 * >= 0: they were drawn on the device, sample i's token (and logprob) in entry DEV + i; else
 * each draws here from the host row LOGITS. */
static int fork_samples(struct pagoda_engine *e, struct sequence *seq, const float *logits,
                        const struct sampler_params *sp, int dev) {
  struct request *r = seq->req;
  struct sched_seq *after = &seq->s;
  for (int i = 1; i < r->num_seqs; i++) {
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
    int32_t tok = dev >= 0 ? e->ds_tok[dev + i] : sampler_pick(&e->samplers[0], sp, logits, &c->rng);
    if (sequence_push_token(c, tok, e->tok, e->max_model_len))
      return -1;
    record_logprob(e, c, seq, dev < 0 ? -1 : dev + i);
    e->generated++;
    engine_mark_dirty(e, c);
    if (c->finish)
      engine_finish_seq(e, c);
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

/* The graph size a decode step of B sequences is padded to: 1, 2, 4, then multiples of 8 (vLLM's
 * sizes), never above MAX (max_num_seqs, itself a size). */
static int graph_size(int b, int max) {
  int p = b <= 1 ? 1 : b <= 2 ? 2 : b <= 4 ? 4 : (b + 7) / 8 * 8;
  return p < max ? p : max;
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
  /* A decode-only step (one new token per item, each with its logits row) on a backend with
   * graphs is padded to a graph size, its block tables at the full stride. */
  int graph = e->be->caps.graphs, B = o->num_items, Bp = B;
  for (int b = 0; b < B && graph; b++)
    graph = o->items[b].num_new == 1 && o->items[b].seq->num_computed + 1 == o->items[b].seq->num_tokens;
  if (graph) {
    Bp = graph_size(B, e->p.max_num_seqs);
    graph = Bp <= e->p.max_num_batched_tokens;
  }
  if (graph)
    stride = e->max_blocks_per_seq;
  else
    Bp = B;
  for (int b = 0; b < o->num_items; b++) {
    const struct sched_seq *s = o->items[b].seq;
    int n = o->items[b].num_new, start = s->num_computed;
    e->query_start[b] = t;
    const struct sequence *sq = (const struct sequence *)s;
    for (int j = 0; j < n; j++, t++) {
      int pos = start + j;
      e->input_ids[t] = s->tokens[pos];
      if (sq->pend && pos == s->num_tokens - 1) /* sampled by the step in flight: its id is on the device */
        e->input_ids[t] = e->async_dev ? -1 - sq->pend_entry : e->flight_tok[sq->pend_entry];
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
  int num_sample_rows = nl;
  for (int b = 0; b < o->num_items; b++) { /* prompt positions whose next token is scored */
    const struct sched_seq *s = o->items[b].seq;
    int start = s->num_computed, end = start + o->items[b].num_new;
    if (end > s->num_prompt - 1)
      end = s->num_prompt - 1;
    e->lp_num_rows[b] = 0;
    if (!((const struct sequence *)s)->req->prompt_lp || end <= start)
      continue;
    e->lp_row0[b] = nl;
    e->lp_pos0[b] = start;
    e->lp_num_rows[b] = end - start;
    for (int j = start; j < end; j++)
      e->logits_idx[nl++] = e->query_start[b] + (j - start);
  }
  /* Device sampling keeps the logits on the device; prompt-logprob rows are then scored there
   * too (ops->logprob_rows), else the step takes the host path. */
  e->num_sample_rows = num_sample_rows;
  e->dev_logits = e->device_sampling && num_sample_rows <= e->p.max_num_seqs &&
                  (nl == num_sample_rows || e->be->ops->logprob_rows);
  if (!e->dev_logits && nl > e->logits_cap) { /* grows only while prompt logprobs are asked for */
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
  if (!graph || nl != num_sample_rows) /* (a decode step scores no prompt positions) */
    return model_forward(e->model, &batch, e->dev_logits ? NULL : e->logits);
  for (int b = B; b < Bp; b++, t++) { /* padding rows: they read the null block, write nothing */
    e->query_start[b] = t;
    e->input_ids[t] = 0;
    e->positions[t] = 0;
    e->slots[t] = -1;
    e->seq_lens[b] = 1;
    memset(e->block_tables + (size_t)b * stride, 0, (size_t)stride * sizeof(int32_t));
    e->logits_idx[nl++] = t;
  }
  e->query_start[Bp] = t;
  batch.num_tokens = t;
  batch.num_seqs = Bp;
  batch.num_logits = nl;
  /* graph-stable bounds: the model length, or the backend's short context when every sequence fits
   * it (a graph of its own: backend_caps.graph_short_ctx) */
  const int short_ctx = e->be->caps.graph_short_ctx;
  batch.max_seq_len =
      short_ctx > 0 && max_len <= short_ctx && short_ctx < e->max_model_len ? short_ctx : e->max_model_len;
  batch.max_query_len = 1;
  return model_forward_graph(e->model, &batch, e->dev_logits ? NULL : e->logits);
}

/* 1 for the first step of n > 1 (sample 0's row; the others fork from it). */
static int is_fork_row(const struct sequence *s) {
  return !s->req->beam && s->index == 0 && s->req->num_seqs > 1 && !s->req->seqs[1].started;
}

/* 1 when the backend samples every request kind where the logits are: forks (sample_rows),
 * logprobs (stash_rows + topk_rows of the raw rows), beams (topk_rows of the processed rows). */
static int dev_all_kinds(const struct pagoda_engine *e) {
  const struct backend_ops *op = e->be->ops;
  return op->sample_rows && op->stash_rows && op->topk_rows;
}

/* 1 when S's row must be on the host: without dev_all_kinds, beams and the first step of n > 1
 * read it whole, and logprobs keep the raw row; with it, only beams wider than the vocabulary
 * allows. */
static int needs_host_row(const struct pagoda_engine *e, const struct sequence *s) {
  if (dev_all_kinds(e))
    return s->req->beam && 2 * s->req->beam->width > e->vocab;
  return s->req->beam || is_fork_row(s) || s->req->sp.logprobs;
}

/* Room for N device entries (ds_*; at least max_num_seqs). 0, or -1 with err_last() set. */
static int ds_reserve(struct pagoda_engine *e, int n) {
  if (n < e->p.max_num_seqs)
    n = e->p.max_num_seqs;
  if (n <= e->ds_cap)
    return 0;
  size_t K = BACKEND_TOPK_MAX, per = 4 * sizeof(int32_t) + sizeof(struct backend_sample_params) +
                                    sizeof(struct sequence *) + sizeof(float) + K * (sizeof(int32_t) + sizeof(float));
  char *m = malloc((size_t)n * per + (size_t)e->p.max_num_seqs * sizeof(int32_t) + 64);
  if (!m)
    return ERR("out of memory for the device sampling entries of %d sequences", n);
  free(e->ds_mem);
  e->ds_mem = m;
  e->ds_cap = n;
  /* the widest types first, so every array stays aligned */
  e->ds_params = (struct backend_sample_params *)m, m += (size_t)n * sizeof *e->ds_params;
  e->ds_seq = (struct sequence **)m, m += (size_t)n * sizeof *e->ds_seq;
  e->ds_tlp = (float *)m, m += (size_t)n * sizeof(float);
  e->ds_top_lp = (float *)m, m += (size_t)n * K * sizeof(float);
  e->ds_top_ids = (int32_t *)m, m += (size_t)n * K * sizeof(int32_t);
  e->ds_rows = (int32_t *)m, m += (size_t)n * sizeof(int32_t);
  e->ds_tok = (int32_t *)m, m += (size_t)n * sizeof(int32_t);
  e->ds_stash = (int32_t *)m, m += (size_t)n * sizeof(int32_t);
  e->ds_lp_idx = (int32_t *)m, m += (size_t)n * sizeof(int32_t);
  e->ds_item = (int32_t *)m;
  return 0;
}

/* The sampling parameters of a draw by SEQ's generator from SP (u as sampler_pick takes it). */
static struct backend_sample_params draw_params(const struct sampler_params *sp, struct sequence *seq) {
  int greedy = sp->temperature <= 0 || sp->top_k == 1;
  return (struct backend_sample_params){greedy ? 0.0f : sp->temperature, sp->top_k, sp->top_p, sp->min_p,
                                        greedy ? 0.0f : (float)rng_uniform(&seq->rng)};
}

/* Room for NEED processor entries and NEED_BIAS logit_bias values in the step's staging (grown
 * to twice the need, so steady state reallocates nothing). */
static int grow_proc(struct pagoda_engine *e, size_t need, size_t need_bias) {
  if (need > e->proc_cap) {
    struct backend_proc_entry *p = realloc(e->proc, need * 2 * sizeof *p);
    if (!p)
      return ERR("out of memory for the logits processors of %zu tokens", need);
    e->proc = p;
    e->proc_cap = need * 2;
  }
  if (need_bias > e->bias_cap) {
    float *p = realloc(e->proc_bias, need_bias * 2 * sizeof *p);
    if (!p)
      return ERR("out of memory for %zu logit_bias values", need_bias);
    e->proc_bias = p;
    e->bias_cap = need_bias * 2;
  }
  return 0;
}

/* Every kind on the device (dev_all_kinds), for a step whose logits stayed there: the raw rows
 * of logprob requests go to the stash, the processors of every row up as entries (one copy), one
 * sample_rows call draws every sample (n per fork row, each with its own generator's u: the
 * step's sync), then topk_rows scores the logprob entries' tokens and top logprobs on the stash
 * and the beam rows' 2W candidates on the processed rows. Only ids and values come back. */
static int device_sample_all(struct pagoda_engine *e, const struct scheduler_output *o) {
  struct backend *be = e->be;
  int num_ent = 0;
  size_t need = 0, need_bias = 0;
  for (int b = 0; b < o->num_items; b++) {
    if (e->logit_row[b] < 0)
      continue;
    const struct sequence *s = (const struct sequence *)o->items[b].seq;
    num_ent += is_fork_row(s) ? s->req->num_seqs : 1;
    struct sampler_params sp;
    sequence_sampler_params(s, &sp);
    need += (size_t)sp.num_bias + (size_t)s->s.num_prompt + (size_t)sequence_num_output(s) + (size_t)sp.num_suppress;
    need_bias += (size_t)sp.num_bias;
  }
  if (ds_reserve(e, num_ent))
    return -1;
  if (grow_proc(e, need, need_bias))
    return -1;
  /* entries: samples first (in item order, a fork row's n samples together), then beam rows */
  int ne = 0, nb = 0, ns = 0, nbeam = 0, num_stash = 0, k_lp = 0, k_beam = 0;
  for (int b = 0; b < o->num_items; b++) {
    e->ds_item[b] = -1;
    e->picked[b] = -1;
    struct sequence *s = (struct sequence *)o->items[b].seq;
    if (e->logit_row[b] < 0 || s->req->beam)
      continue;
    struct sampler_params sp;
    sequence_sampler_params(s, &sp);
    int stash = -1;
    if (s->req->sp.logprobs) {
      stash = num_stash;
      e->ds_lp_idx[num_stash++] = e->logit_row[b];
      k_lp = s->req->sp.top_logprobs > k_lp ? s->req->sp.top_logprobs : k_lp;
      k_lp = k_lp < e->vocab ? k_lp : e->vocab;
    }
    e->ds_item[b] = ns;
    int n = is_fork_row(s) ? s->req->num_seqs : 1;
    for (int i = 0; i < n; i++, ns++) {
      struct sequence *c = &s->req->seqs[i == 0 ? s->index : i];
      e->ds_seq[ns] = c;
      e->ds_rows[ns] = e->logit_row[b];
      e->ds_stash[ns] = stash;
      e->ds_params[ns] = draw_params(&sp, c);
    }
  }
  int num_samples = ns;
  for (int b = 0; b < o->num_items; b++) {
    struct sequence *s = (struct sequence *)o->items[b].seq;
    if (e->logit_row[b] < 0 || !s->req->beam || needs_host_row(e, s))
      continue;
    e->ds_item[b] = num_samples + nbeam;
    e->ds_seq[num_samples + nbeam] = s;
    e->ds_rows[num_samples + nbeam++] = e->logit_row[b];
    k_beam = 2 * s->req->beam->width > k_beam ? 2 * s->req->beam->width : k_beam;
  }
  for (int b = 0; b < o->num_items; b++) { /* processors of the device rows */
    int row = e->logit_row[b];
    if (row < 0 || e->ds_item[b] < 0)
      continue;
    struct sequence *s = (struct sequence *)o->items[b].seq;
    struct sampler_params sp;
    sequence_sampler_params(s, &sp);
    ne += sampler_proc_entries(&e->samplers[0], &sp, s->tokens, s->s.num_prompt, s->tokens + s->s.num_prompt,
                               sequence_num_output(s), row, e->proc + ne, e->proc_bias, nb);
    nb += sp.num_bias;
  }
  float *logits = model_logits_device(e->model);
  for (int b = 0; b < o->num_items; b++) /* host rows, raw (the host applies their processors) */
    if (e->logit_row[b] >= 0 && e->ds_item[b] < 0 &&
        model_logits_download(e->model, e->logit_row[b], 1, e->logits + (size_t)e->logit_row[b] * e->vocab))
      return -1;
  if (num_stash && be->ops->stash_rows(be, logits, e->vocab, e->ds_lp_idx, num_stash))
    return -1;
  if (ne && be->ops->process(be, logits, e->vocab, e->proc, ne, e->proc_bias, nb))
    return -1;
  if (num_samples && be->ops->sample_rows(be, e->ds_tok, logits, e->ds_rows, num_samples, e->vocab, e->ds_params))
    return -1;
  if (num_stash) { /* the logprob entries, packed: stash row, target, results back in place */
    int m = 0;
    for (int i = 0; i < num_samples; i++)
      if (e->ds_stash[i] >= 0) {
        e->ds_lp_idx[m] = i;
        e->ds_rows[m] = e->ds_stash[i]; /* ds_rows of samples is not read past sample_rows */
        e->ds_stash[m++] = e->ds_tok[i];
      }
    if (be->ops->topk_rows(be, e->ds_top_ids, e->ds_top_lp, e->ds_tlp, NULL, e->vocab, e->ds_rows, e->ds_stash, m,
                           k_lp))
      return -1;
    /* unpack from the back so no packed result is overwritten before it moves */
    for (int j = m - 1; j >= 0; j--) {
      int i = e->ds_lp_idx[j];
      e->ds_tlp[i] = e->ds_tlp[j];
      memmove(e->ds_top_ids + (size_t)i * BACKEND_TOPK_MAX, e->ds_top_ids + (size_t)j * k_lp,
              (size_t)k_lp * sizeof(int32_t));
      memmove(e->ds_top_lp + (size_t)i * BACKEND_TOPK_MAX, e->ds_top_lp + (size_t)j * k_lp,
              (size_t)k_lp * sizeof(float));
    }
  }
  if (nbeam) {
    int32_t *ids = e->ds_top_ids + (size_t)num_samples * BACKEND_TOPK_MAX;
    float *lps = e->ds_top_lp + (size_t)num_samples * BACKEND_TOPK_MAX;
    if (be->ops->topk_rows(be, ids, lps, NULL, logits, e->vocab, e->ds_rows + num_samples, NULL, nbeam, k_beam))
      return -1;
    for (int j = nbeam - 1; j >= 0; j--) { /* (nbeam, k_beam) packed -> stride BACKEND_TOPK_MAX */
      memmove(ids + (size_t)j * BACKEND_TOPK_MAX, ids + (size_t)j * k_beam, (size_t)k_beam * sizeof(int32_t));
      memmove(lps + (size_t)j * BACKEND_TOPK_MAX, lps + (size_t)j * k_beam, (size_t)k_beam * sizeof(float));
    }
  }
  for (int b = 0; b < o->num_items; b++) {
    const struct sequence *s = (const struct sequence *)o->items[b].seq;
    if (e->ds_item[b] >= 0 && !s->req->beam)
      e->picked[b] = e->ds_tok[e->ds_item[b]];
  }
  return 0;
}

/* Sampling on the device for a step whose logits stayed there (e->dev_logits): host rows are
 * downloaded to e->logits first; the other rows' processors go up as entries (one copy), then
 * one sample call picks every row and synchronises (the step's one sync). Sets e->picked[b] to
 * the token of device rows and -1 for host rows. The uniform draw u comes from the sequence's
 * generator exactly as sampler_pick would take it (none when greedy), so both backends pick the
 * same token from the same draw. */
static int device_sample(struct pagoda_engine *e, const struct scheduler_output *o) {
  if (dev_all_kinds(e))
    return device_sample_all(e, o);
  struct backend *be = e->be;
  size_t need = 0, need_bias = 0;
  int nl = 0;
  if (ds_reserve(e, 0))
    return -1;
  for (int b = 0; b < o->num_items; b++) {
    e->ds_item[b] = -1;
    if (e->logit_row[b] < 0)
      continue;
    nl++;
    const struct sequence *s = (const struct sequence *)o->items[b].seq;
    if (needs_host_row(e, s))
      continue;
    struct sampler_params sp; /* room for one entry per bias value, history token and suppressed id */
    sequence_sampler_params(s, &sp);
    need += (size_t)sp.num_bias + (size_t)s->s.num_prompt + (size_t)sequence_num_output(s) + (size_t)sp.num_suppress;
    need_bias += (size_t)sp.num_bias;
  }
  if (grow_proc(e, need, need_bias))
    return -1;
  int ne = 0, nb = 0;
  for (int b = 0; b < o->num_items; b++)
    e->picked[b] = -1;
  for (int b = 0; b < o->num_items; b++) {
    int row = e->logit_row[b];
    if (row < 0)
      continue;
    struct sequence *s = (struct sequence *)o->items[b].seq;
    struct backend_sample_params *dp = &e->dev_params[row];
    if (needs_host_row(e, s)) {
      *dp = (struct backend_sample_params){0};
      if (model_logits_download(e->model, row, 1, e->logits + (size_t)row * e->vocab))
        return -1;
      continue;
    }
    struct sampler_params sp;
    sequence_sampler_params(s, &sp);
    int n = sampler_proc_entries(&e->samplers[0], &sp, s->tokens, s->s.num_prompt, s->tokens + s->s.num_prompt,
                                 sequence_num_output(s), row, e->proc + ne, e->proc_bias, nb);
    ne += n;
    nb += sp.num_bias;
    *dp = draw_params(&sp, s);
    e->ds_item[b] = row;
  }
  float *logits = model_logits_device(e->model);
  if (ne && be->ops->process(be, logits, e->vocab, e->proc, ne, e->proc_bias, nb))
    return -1;
  if (be->ops->sample(be, e->dev_tokens, logits, nl, e->vocab, e->dev_params))
    return -1;
  for (int b = 0; b < o->num_items; b++)
    if (e->ds_item[b] >= 0)
      e->picked[b] = e->dev_tokens[e->logit_row[b]];
  return 0;
}

/* 1. Schedule: frees the requests whose final outputs were read after the last step, then asks
 * the scheduler for this step's items (admissions, chunks, preemptions, block copies). */
static int engine_schedule(struct pagoda_engine *e, const struct scheduler_output **o) {
  struct request **keep = &e->dead; /* a launched step may still name its sequences */
  for (struct request *r = e->dead, *n; r; r = n) {
    n = r->next;
    if (r->num_inflight > 0) {
      *keep = r;
      keep = &r->next;
      continue;
    }
    e->num_sync_reqs -= r->sync_steps;
    request_free(r);
  }
  *keep = NULL;
  return scheduler_schedule(&e->sched, o) ? PAGODA_ERR_OUT_OF_MEMORY : PAGODA_OK;
}

/* The requests of the step's items end, reported as aborted (their blocks freed). */
static void abort_items(struct pagoda_engine *e, const struct scheduler_output *o) {
  for (int b = 0; b < o->num_items; b++) {
    struct request *r = ((struct sequence *)o->items[b].seq)->req;
    for (int k = 0; k < r->num_seqs; k++)
      if (!r->seqs[k].finish) {
        r->seqs[k].finish = PAGODA_FINISH_ABORT;
        engine_finish_seq(e, &r->seqs[k]);
      }
  }
}

/* 2. Run: the batch to the backend and one forward pass. When the device fails the batch, its
 * requests end (reported as aborted, blocks freed) and the engine keeps serving the others. */
static int engine_run(struct pagoda_engine *e, const struct scheduler_output *o) {
  if (run_batch(e, o) == 0)
    return PAGODA_OK;
  log_error("forward pass failed: %s", err_last_where());
  abort_items(e, o);
  return PAGODA_ERR_BACKEND;
}

/* 3. Postprocess: prompt logprobs, the scheduler's bookkeeping, then a token for every item that
 * produced logits (processors, sampling, forks, beams, stop conditions). */
static int engine_postprocess(struct pagoda_engine *e, const struct scheduler_output *o) {
  e->steps++;
  /* On the device the sampling rows go first: scoring prompt-logprob rows reuses their buffer. */
  if (e->dev_logits && (device_sample(e, o) || engine_prompt_logprobs_device(e, o))) {
    log_error("sampling on the device failed: %s", err_last_where());
    return PAGODA_ERR_BACKEND;
  }
  if (!e->dev_logits)
    engine_prompt_logprobs(e, o);
  scheduler_update(&e->sched);
  /* Phase 1, in parallel over sequences (each has its own logits row and generator; each
   * thread its own scratch): processors, then the token for plain samples. Forks and beams
   * touch shared state and are finished in phase 2. */
  int nl = 0;
  for (int b = 0; b < o->num_items; b++)
    nl += e->logit_row[b] >= 0;
  int nt = (long)nl * e->vocab >= (1L << 17) ? e->num_samplers : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
  for (int b = 0; b < o->num_items; b++) {
    if (e->dev_logits && e->ds_item[b] >= 0)
      continue; /* sampled (or its candidates taken) on the device */
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
    int forks = s->index == 0 && s->req->num_seqs > 1 && !s->req->seqs[1].started;
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
    int dev = e->dev_logits ? e->ds_item[b] : -1; /* its first device entry, -1: a host row */
    struct sampler_params spv;
    sequence_sampler_params(s, &spv);
    const struct sampler_params *sp = &spv;
    if (s->req->beam) { /* beams report once, at the end, in rank order */
      struct beam_env env = {&e->sched, &e->kv, e->tok, e->vocab, e->max_model_len};
      int rc = dev < 0 ? beam_on_logits(&env, s, lg)
                       : beam_on_candidates(&env, s, e->ds_top_ids + (size_t)dev * BACKEND_TOPK_MAX,
                                            e->ds_top_lp + (size_t)dev * BACKEND_TOPK_MAX);
      if (rc < 0)
        return PAGODA_ERR_OUT_OF_MEMORY;
      e->generated++;
      for (int k = 0; rc == 1 && k < s->req->num_seqs; k++)
        engine_mark_dirty(e, &s->req->seqs[k]);
      continue;
    }
    if (is_fork_row(s) && fork_samples(e, s, lg, sp, dev))
      return PAGODA_ERR_OUT_OF_MEMORY;
    int32_t tok = e->picked[b] >= 0 ? e->picked[b] : sampler_pick(&e->samplers[0], sp, lg, &s->rng);
    if (sequence_push_token(s, tok, e->tok, e->max_model_len))
      return PAGODA_ERR_OUT_OF_MEMORY;
    record_logprob(e, s, s, dev);
    e->generated++;
    engine_mark_dirty(e, s);
    if (s->finish)
      engine_finish_seq(e, s);
  }
  account_waste(e);
  return PAGODA_OK;
}

/* ---- Asynchronous steps ----------------------------------------------------------------------
 * A step S is launched: its batch goes up (the ids of sequences whose last token the previous
 * step P sampled are read on the device from P's slot), the forward pass and the sampling of
 * every logits row are enqueued (ops->process, ops->sample_async into S's slot; on a host backend
 * the host sampler picks at once), each row's uniform draw taken from the sequence's generator
 * exactly where the synchronous step takes it. Then P's ids are read (sample_wait: the GPU is
 * busy with S meanwhile) and P is post-processed: placeholders filled, stop conditions, finished
 * sequences leave. Then S's bookkeeping: the scheduler's update (its full blocks hashed, their
 * tokens all known now) and a placeholder for every S entry whose sequence is still running;
 * the entries of sequences that finished at P are discarded (their extra KV slot went back with
 * their blocks; what S wrote there is never read). Each call reports P's tokens. */

int engine_request_sync_steps(const struct request *r) {
  const struct sampler_params *p = &r->sampler;
  return r->beam || r->num_seqs > 1 || r->sp.logprobs || r->prompt_lp || r->sp.prompt_logprobs ||
         p->repetition_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

int engine_async_init(struct pagoda_engine *e) {
  const struct backend_ops *op = e->be->ops;
  const char *env = getenv("PAGODA_ASYNC_STEPS"); /* 0: every step synchronous */
  int dev = !e->be->caps.host_memory;
  e->async_dev = dev;
  e->async_on = e->be->caps.async_steps && !(env && !strcmp(env, "0")) && model_tp_async_ok(e->model) &&
                (!dev || (e->device_sampling && op->sample_async && op->sample_wait && op->resolve_ids));
  if (!e->async_on)
    return 0;
  int n = e->p.max_num_seqs;
  e->flight_tok = calloc((size_t)2 * n, sizeof *e->flight_tok);
  e->flight[0].seq = calloc((size_t)n, sizeof(struct sequence *));
  e->flight[1].seq = calloc((size_t)n, sizeof(struct sequence *));
  if (!e->flight_tok || !e->flight[0].seq || !e->flight[1].seq)
    return ERR("out of memory for the asynchronous steps of %d sequences", n);
  return 0;
}

void engine_async_free(struct pagoda_engine *e) {
  for (int k = 0; k < 2; k++) {
    if (e->flight[k].active && e->async_dev) /* nothing may still write into what is freed next */
      e->be->ops->sample_wait(e->be, k, e->flight_tok + (size_t)k * e->p.max_num_seqs, e->flight[k].n);
    e->flight[k].active = 0;
    free(e->flight[k].seq);
    e->flight[k].seq = NULL;
  }
  free(e->flight_tok);
  e->flight_tok = NULL;
}

/* Launches step O into slot e->next_slot: forward, then sampling (see above). 0, or -1 with
 * err_last() set (the caller aborts the items). */
static int async_launch(struct pagoda_engine *e, const struct scheduler_output *o) {
  int slot = e->next_slot;
  struct engine_flight *f = &e->flight[slot];
  if (run_batch(e, o))
    return -1;
  e->steps++;
  if (ds_reserve(e, 0))
    return -1;
  size_t need = 0, need_bias = 0;
  for (int b = 0; b < o->num_items; b++)
    if (e->logit_row[b] >= 0) {
      const struct sequence *s = (const struct sequence *)o->items[b].seq;
      need += (size_t)s->req->sampler.num_bias + (size_t)s->req->num_suppress;
      need_bias += (size_t)s->req->sampler.num_bias;
    }
  if (grow_proc(e, need, need_bias))
    return -1;
  int n = 0, ne = 0, nb = 0;
  for (int b = 0; b < o->num_items; b++) {
    if (e->logit_row[b] < 0)
      continue;
    struct sequence *s = (struct sequence *)o->items[b].seq;
    f->seq[n] = s;
    e->ds_item[b] = n;
    e->ds_rows[n] = e->logit_row[b];
    s->req->num_inflight++;
    if (e->async_dev) { /* no penalties here (sync_steps), so the entries read no token history */
      struct sampler_params sp;
      sequence_sampler_params(s, &sp);
      ne += sampler_proc_entries(&e->samplers[0], &sp, s->tokens, s->s.num_prompt, s->tokens + s->s.num_prompt,
                                 sequence_num_output(s), e->logit_row[b], e->proc + ne, e->proc_bias, nb);
      nb += sp.num_bias;
      e->ds_params[n] = draw_params(&sp, s);
    }
    n++;
  }
  f->n = n;
  f->active = 1;
  e->next_slot ^= 1;
  int32_t *tok = e->flight_tok + (size_t)slot * e->p.max_num_seqs;
  if (e->async_dev) {
    struct backend *be = e->be;
    float *logits = model_logits_device(e->model);
    if (ne && be->ops->process(be, logits, e->vocab, e->proc, ne, e->proc_bias, nb))
      return -1;
    return be->ops->sample_async(be, slot, logits, e->ds_rows, n, e->vocab, e->ds_params);
  }
  /* A host backend: the logits are in e->logits; the host sampler picks now, in parallel over
   * rows as the synchronous postprocess does. */
  int nt = (long)n * e->vocab >= (1L << 17) ? e->num_samplers : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
  for (int i = 0; i < n; i++) {
    struct sequence *s = f->seq[i];
    struct sampler *smp = &e->samplers[omp_get_thread_num()];
    float *lg = e->logits + (size_t)e->ds_rows[i] * e->vocab;
    struct sampler_params sp;
    sequence_sampler_params(s, &sp);
    sampler_apply_processors(smp, &sp, lg, s->tokens, s->s.num_prompt, s->tokens + s->s.num_prompt,
                             sequence_num_output(s));
    tok[i] = sampler_pick(smp, &sp, lg, &s->rng);
  }
  return 0;
}

/* Reads the ids of the launched step in SLOT and post-processes it: each live entry's placeholder
 * becomes its token (text, stop conditions, max_tokens); entries of sequences that finished
 * meanwhile are dropped. PAGODA_OK, or an error status (the sequences of a failed read end as
 * aborted). */
static int async_finish(struct pagoda_engine *e, int slot) {
  struct engine_flight *f = &e->flight[slot];
  if (!f->active)
    return PAGODA_OK;
  f->active = 0;
  int32_t *tok = e->flight_tok + (size_t)slot * e->p.max_num_seqs;
  int rc = PAGODA_OK;
  if (e->async_dev && e->be->ops->sample_wait(e->be, slot, tok, f->n)) {
    log_error("sampling on the device failed: %s", err_last_where());
    rc = PAGODA_ERR_BACKEND;
  }
  for (int i = 0; i < f->n; i++) {
    struct sequence *s = f->seq[i];
    if (!s)
      continue;
    s->req->num_inflight--;
    if (s->finish)
      continue; /* aborted meanwhile: its placeholder went with it */
    if (s->pend) { /* (none for a token that ends the sequence by length: see async_update) */
      s->pend = 0;
      s->s.num_tokens--;
    }
    if (rc != PAGODA_OK) {
      s->finish = PAGODA_FINISH_ABORT;
      engine_finish_seq(e, s);
      continue;
    }
    if (sequence_push_token(s, tok[i], e->tok, e->max_model_len))
      rc = PAGODA_ERR_OUT_OF_MEMORY;
    e->generated++;
    engine_mark_dirty(e, s);
    if (s->finish)
      engine_finish_seq(e, s);
  }
  return rc;
}

/* After the previous step was post-processed: the scheduler's update of launched step O (in
 * SLOT) and a placeholder for each of its entries whose sequence still runs, unless the token
 * ends it by length (max_tokens, the context): then the scheduler sees nothing left to compute
 * and the batches stay those of synchronous steps. */
static void async_update(struct pagoda_engine *e, const struct scheduler_output *o, int slot) {
  for (int b = 0; b < o->num_items; b++) { /* scheduler_update, less the sequences that ended */
    struct sched_seq *q = o->items[b].seq;
    if (((struct sequence *)q)->finish || q->state == SCHED_NONE)
      continue;
    q->num_computed += o->items[b].num_new;
    kv_manager_cache_full_blocks(&e->kv, &q->kv, q->tokens, q->num_computed);
  }
  struct engine_flight *f = &e->flight[slot];
  for (int i = 0; i < f->n; i++) {
    struct sequence *s = f->seq[i];
    if (s->finish) { /* ended at the previous step: this result is dropped */
      f->seq[i] = NULL;
      s->req->num_inflight--;
      continue;
    }
    if (sequence_num_output(s) + 1 >= s->req->max_tokens || s->s.num_tokens + 1 >= e->max_model_len)
      continue; /* its last token, whatever it is: no placeholder, so the next steps leave it out
                 * (as a synchronous step would, after it finished) */
    s->tokens[s->s.num_tokens++] = 0; /* never read: run_batch takes the id from the device */
    s->pend = 1;
    s->pend_entry = slot * e->p.max_num_seqs + i;
  }
  account_waste(e);
}

/* One asynchronous call: launch the next step, then report the previous one. */
static int async_step(struct pagoda_engine *e, int *n_outs) {
  int prev = e->next_slot ^ 1, had_prev = e->flight[prev].active, slot = e->next_slot;
  const struct scheduler_output *o;
  int rc = engine_schedule(e, &o);
  if (rc != PAGODA_OK)
    return rc;
  int launched = 0;
  if (o->num_items) {
    if (async_launch(e, o) == 0) {
      launched = 1;
    } else {
      log_error("forward pass failed: %s", err_last_where());
      if (e->flight[slot].active && e->async_dev) /* whatever was enqueued is done before anything is reused */
        e->be->ops->sync(e->be);
      struct engine_flight *f = &e->flight[slot];
      for (int i = 0; f->active && i < f->n; i++)
        f->seq[i]->req->num_inflight--;
      f->active = 0;
      e->next_slot = slot;
      abort_items(e, o);
      rc = PAGODA_ERR_BACKEND;
    }
  }
  int rc2 = async_finish(e, prev);
  if (rc == PAGODA_OK)
    rc = rc2;
  if (launched)
    async_update(e, o, slot);
  else if (rc == PAGODA_OK && !had_prev && scheduler_has_work(&e->sched) && e->num_dirty == 0 &&
           o->num_preempted == 0) {
    ERR("no request can make progress: the KV pool is too small for the running requests (raise --pa-memory-mb)");
    rc = PAGODA_ERR_OUT_OF_MEMORY;
  }
  engine_collect_outputs(e, n_outs);
  return rc;
}

int pagoda_engine_step(pagoda_engine_t *e, const struct pagoda_output **outs, int *n_outs) {
  *outs = e->outs;
  *n_outs = 0;
  if (e->async_on && e->num_sync_reqs == 0)
    return async_step(e, n_outs);
  /* A synchronous step: a launched step is read and post-processed first. */
  int rc = async_finish(e, e->next_slot ^ 1);
  if (rc != PAGODA_OK) {
    engine_collect_outputs(e, n_outs);
    return rc;
  }
  const struct scheduler_output *o;
  rc = engine_schedule(e, &o);
  if (rc != PAGODA_OK)
    return rc;
  if (o->num_items) {
    if ((rc = engine_run(e, o)) != PAGODA_OK) {
      engine_collect_outputs(e, n_outs);
      return rc;
    }
    if ((rc = engine_postprocess(e, o)) != PAGODA_OK)
      return rc;
  } else if (scheduler_has_work(&e->sched) && e->num_dirty == 0 && o->num_preempted == 0) {
    /* Nothing runnable and nothing to report: only possible when the sequences holding blocks
     * wait for one that cannot get any (beams of one request on a pool too small for them). */
    return ERR("no request can make progress: the KV pool is too small for the running requests "
               "(raise --pa-memory-mb)"), PAGODA_ERR_OUT_OF_MEMORY;
  }
  engine_collect_outputs(e, n_outs);
  return PAGODA_OK;
}
