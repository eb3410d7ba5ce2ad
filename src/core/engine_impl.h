/* engine_impl.h - the engine's internals, shared by its four files (not a public header).
 *
 * struct pagoda_engine holds everything one engine owns, and why:
 * - the parameters it was created with, the backend, the model and the tokenizer;
 * - the KV manager (block pool, prefix cache) and the scheduler, which decide what runs;
 * - one host sampler per OpenMP thread (the reference sampler; scratch, so nothing is
 *   allocated per token) and the end-of-generation ids;
 * - the step's batch in host memory (ids, positions, slots, query starts, sequence lengths,
 *   block tables, logits rows), sized once at creation for the largest step; the model copies
 *   it to the backend;
 * - the logits of the step in host memory, and where each scheduled item's rows are;
 * - the requests: a live list (unfinished or unreported) and a dead list (reported finished,
 *   freed at the start of the next step), the sequences with something to report, and the
 *   output array the caller reads until its next call;
 * - counters for pagoda_engine_stats.
 *
 * The files: engine_create.c (parameters, creation, sizing, free), engine_step.c
 * (pagoda_engine_step: schedule, run, postprocess), engine_output.c (outputs, prompt logprobs,
 * stats), engine.c (requests, aborts, and the text helpers of pagoda.h). One thread owns an
 * engine (no locks inside); requests and aborts are applied between steps. */
#ifndef PAGODA_ENGINE_IMPL_H
#define PAGODA_ENGINE_IMPL_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/kv_manager.h"
#include "core/request.h"
#include "core/scheduler.h"
#include "model/model.h"
#include "pagoda.h"
#include "sampling/sampler.h"
#include "text/tokenizer.h"

struct pagoda_engine {
  struct pagoda_engine_params p; /* p.model: the resolved local path (model_path) */
  char *model_path;              /* pagoda_resolve_model's answer for the model given */
  struct backend *be;       /* rank 0's under tensor parallelism */
  struct model *model;
  struct tp_group *tp;      /* tensor parallelism (p.tp > 1): the rank threads, else NULL */
  struct backend **tp_bes;  /* (tp world) rank r's backend, tp_bes[0] = be; NULL without */
  struct tp_mp *mp;         /* multi-process tensor parallelism (p.tp_world > 1, rank 0): the
                               group the model's calls are mirrored to (src/dist/mp.h), else NULL */
  struct tokenizer *tok;
  int vocab, max_model_len, block_size, max_blocks_per_seq;
  struct kv_manager kv;
  struct scheduler sched;
  struct sampler *samplers; /* (num_samplers) one scratch per OpenMP thread of the sampling loop */
  int num_samplers;
  int32_t *picked;         /* (max_num_seqs) token sampled for each scheduled item, -1: later */
  int32_t *eog;            /* (num_eog) ids that end generation (EOS, end of turn) */
  int num_eog;
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
  /* Prompt logprobs of scheduled item b: rows [lp_row0[b], + lp_num_rows[b]) score prompt positions
   * lp_pos0[b].. (each row predicts the next prompt token). */
  int32_t *lp_row0, *lp_pos0, *lp_num_rows; /* (max_num_seqs) */
  int32_t *copy_src, *copy_dst; /* (max_num_seqs) */
  /* Sampling where the logits are (caps.device_sampling; PAGODA_DEVICE_SAMPLING=0 turns it off):
   * dev_logits says this step's logits stayed on the device (no prompt-logprob rows); the rows of
   * requests that need the whole row on the host (beams, the first step of n > 1, logprobs) are
   * downloaded, the others processed and sampled on the device, only their ids coming back. */
  int device_sampling, dev_logits;
  int num_sample_rows;                      /* logits rows of the step that sample (the first ones) */
  int32_t *lp_target;                       /* (max_num_batched_tokens) prompt-logprob rows' next tokens */
  float *lp_value;                          /* (max_num_batched_tokens) their log-probabilities */
  struct backend_sample_params *dev_params; /* (max_num_seqs) one per logits row */
  int32_t *dev_tokens;                      /* (max_num_seqs) */
  /* With the backend's sample_rows, stash_rows and topk_rows (every kind on the device): the
   * step's device entries, carved from ds_mem for ds_cap entries. An entry is one sample drawn
   * (the first step of n > 1 draws n from one row) or one beam row. ds_item[b] is item b's first
   * entry, -1 for a row handled on the host. */
  void *ds_mem;
  int ds_cap;
  int32_t *ds_item;                          /* (max_num_seqs) */
  int32_t *ds_rows, *ds_tok, *ds_stash;      /* (ds_cap) logits row, sampled token, stash row */
  struct backend_sample_params *ds_params;  /* (ds_cap) */
  struct sequence **ds_seq;                  /* (ds_cap) the sequence the entry's token goes to */
  float *ds_tlp;                             /* (ds_cap) logprob of the sampled token */
  int32_t *ds_top_ids;                       /* (ds_cap, BACKEND_TOPK_MAX) top logprobs / beam candidates */
  float *ds_top_lp;                          /* (ds_cap, BACKEND_TOPK_MAX) */
  int32_t *ds_lp_idx;                        /* (ds_cap) scratch: entries of a topk_rows call */
  struct backend_proc_entry *proc;          /* (proc_cap) processor entries of the step */
  float *proc_bias;                         /* (bias_cap) their logit_bias values */
  size_t proc_cap, bias_cap;
  /* Asynchronous steps (engine_step.c, docs/cuda.md "Asynchronous steps"): a step is launched
   * (forward and sampling) before the previous one is post-processed. Its sampling entries go to
   * flight[slot] (slot = the step's parity); each sequence that samples gets a placeholder token
   * (sequence.pend) whose id the next step's batch takes from the device (ids < 0, struct batch)
   * or, on a host backend, from flight_tok; when the ids are read, placeholders are filled and
   * the stop conditions run. A sequence that finished meanwhile has its entry discarded. */
  int async_on;            /* caps.async_steps, PAGODA_ASYNC_STEPS not 0, model_tp_async_ok, and on a
                            * device backend device sampling with sample_async / sample_wait /
                            * resolve_ids */
  int async_dev;           /* 1: sampling through ops->sample_async; 0: the host sampler at launch */
  int num_sync_reqs;       /* live requests with sync_steps: while > 0 every step is synchronous */
  int next_slot;           /* the slot the next launched step uses */
  struct engine_flight {
    int active;            /* launched, ids not read yet */
    int n;                 /* its entries */
    struct sequence **seq; /* (max_num_seqs) entry i's sequence; NULL: discarded */
  } flight[2];
  int32_t *flight_tok;     /* (2 * max_num_seqs) the ids of entry slot * max_num_seqs + i, once read */
  struct request *live;    /* doubly linked list of unfinished (or unreported) requests */
  struct request *dead;    /* reported finished: freed at the start of the next step */
  uint64_t next_id;
  struct sequence **dirty; /* (dirty_cap) sequences with something to report */
  int num_dirty, dirty_cap;
  struct pagoda_output *outs; /* (dirty_cap) */
  /* stats */
  double waste_slots, alloc_slots, peak_usage;
  int64_t steps, prompt_computed, generated;
};

/* engine.c */
/* Adds S to the sequences reported at the end of the step (once). */
void engine_mark_dirty(struct pagoda_engine *e, struct sequence *s);
/* SEQ ended (finish set): leaves the scheduler, its blocks go back to the pool. */
void engine_finish_seq(struct pagoda_engine *e, struct sequence *s);

/* engine_step.c */
/* Sets up asynchronous steps after the backend, device sampling and max_num_seqs are known;
 * 0, or -1 with err_last() set. engine_async_free waits for a launched step and frees them. */
int engine_async_init(struct pagoda_engine *e);
void engine_async_free(struct pagoda_engine *e);
/* 1 when R's steps need every token on the host before the next step is launched: penalties
 * (their counts are built from the tokens), logprobs, n > 1, beams, prompt logprobs. */
int engine_request_sync_steps(const struct request *r);

/* engine_output.c */
/* log softmax of each prompt-logprob row at its next prompt token, into the request's array;
 * before scheduler_update (num_computed is still the chunk start). */
void engine_prompt_logprobs(struct pagoda_engine *e, const struct scheduler_output *o);
/* The same for a step whose logits stayed on the device (e->dev_logits): the rows are scored
 * there (model_logits_rows, ops->logprob_rows) in chunks of max_num_seqs; only one float per row
 * comes back. 0, or -1 with err_last() set. */
int engine_prompt_logprobs_device(struct pagoda_engine *e, const struct scheduler_output *o);
/* Fills e->outs from the dirty sequences (*N_OUTS of them), moves fully reported requests to
 * the dead list and calls on_output for each. */
void engine_collect_outputs(struct pagoda_engine *e, int *n_outs);

#endif
