/* engine_flags.c - parsing of the engine options shared by the subcommands. */
#include "cli/engine_flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


int flag_value(const char *name, int argc, char **argv, int *i, const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n))
    return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n])
    return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "error: %s needs a value\n", name);
    return -1;
  }
  *value = argv[++*i];
  return 1;
}

int flag_int64(const char *flag, const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "error: %s expects an integer in [%lld, %lld], got '%s'\n", flag, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

int flag_int(const char *flag, const char *s, long lo, long hi, int *out) {
  long long v;
  if (flag_int64(flag, s, lo, hi, &v))
    return -1;
  *out = (int)v;
  return 0;
}

int flag_double(const char *flag, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
    fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

int engine_flags_parse(struct pagoda_engine_params *p, int argc, char **argv, int *i) {
  const char *v;
  int r;
  double d;
  ON_FLAG("-m", i, -1) {
    p->model = v;
    return 1;
  }
  ON_FLAG("--model", i, -1) {
    p->model = v;
    return 1;
  }
  ON_FLAG("--revision", i, -1) {
    p->revision = v;
    return 1;
  }
  ON_FLAG("--hf-file", i, -1) {
    p->hf_file = v;
    return 1;
  }
  ON_FLAG("--device", i, -1) {
    if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
      fprintf(stderr, "error: --device must be cpu or cuda, got '%s'\n", v);
      return -1;
    }
    p->device = v;
    return 1;
  }
  ON_FLAG("--isq", i, -1) {
    /* the values model/quant_isq.c's isq_parse takes; checked here so a typo is a usage error */
    static const char *const isq_values[] = {"q4_0", "q4_k", "q5_k", "q6_k", "q8_0", "4", "8"};
    int known = 0;
    for (size_t k = 0; k < sizeof isq_values / sizeof *isq_values; k++)
      known |= !strcasecmp(v, isq_values[k]);
    if (!known) {
      fprintf(stderr, "error: --isq must be q4_0, q4_k, q5_k, q6_k, q8_0, 4 (q4_k) or 8 (q8_0), got '%s'\n", v);
      return -1;
    }
    p->isq = v;
    return 1;
  }
  ON_FLAG("--tp-rank", i, -1) return flag_int("--tp-rank", v, 0, 1023, &p->tp_rank) ? -1 : 1;
  ON_FLAG("--tp-world", i, -1) return flag_int("--tp-world", v, 1, 1024, &p->tp_world) ? -1 : 1;
  ON_FLAG("--tp-master", i, -1) {
    if (!*v || !strchr(v, ':')) {
      fprintf(stderr, "error: --tp-master expects host:port (rank 0's rendezvous address), got '%s'\n", v);
      return -1;
    }
    p->tp_master = v;
    return 1;
  }
  ON_FLAG("--tp", i, -1) return flag_int("--tp", v, 1, 64, &p->tp) ? -1 : 1;
  ON_FLAG("--threads", i, -1) return flag_int("--threads", v, 0, 4096, &p->threads) ? -1 : 1;
  ON_FLAG("-t", i, -1) return flag_int("-t", v, 0, 4096, &p->threads) ? -1 : 1;
  ON_FLAG("--paged-attn", i, -1) {
    if (!strcmp(v, "auto"))
      p->paged_attn = PAGODA_PAGED_ATTN_AUTO;
    else if (!strcmp(v, "on"))
      p->paged_attn = PAGODA_PAGED_ATTN_ON;
    else if (!strcmp(v, "off"))
      p->paged_attn = PAGODA_PAGED_ATTN_OFF;
    else {
      fprintf(stderr, "error: --paged-attn must be auto, on or off, got '%s'\n", v);
      return -1;
    }
    return 1;
  }
  ON_FLAG("--pa-block-size", i, -1) {
    if (flag_int("--pa-block-size", v, 1, 1 << 20, &p->block_size))
      return -1;
    if (p->block_size != 8 && p->block_size != 16 && p->block_size != 32) {
      fprintf(stderr, "error: --pa-block-size must be 8, 16 or 32, got %s\n", v);
      return -1;
    }
    return 1;
  }
  ON_FLAG("--pa-memory-mb", i, -1) {
    if (flag_double("--pa-memory-mb", v, 1e-9, 1e12, &d))
      return -1;
    p->pa_memory_mb = d;
    return 1;
  }
  ON_FLAG("--pa-memory-fraction", i, -1) {
    if (flag_double("--pa-memory-fraction", v, 1e-9, 1, &d))
      return -1;
    p->pa_memory_fraction = d;
    return 1;
  }
  ON_FLAG("--pa-context-len", i, -1) return flag_int("--pa-context-len", v, 1, 1 << 30, &p->pa_context_len) ? -1 : 1;
  ON_FLAG("--pa-cache-type", i, -1) {
    if (!strcmp(v, "auto"))
      p->cache_type = PAGODA_CACHE_TYPE_AUTO;
    else if (!strcmp(v, "f8e4m3"))
      p->cache_type = PAGODA_CACHE_TYPE_F8E4M3;
    else if (!strcmp(v, "f32"))
      p->cache_type = PAGODA_CACHE_TYPE_F32;
    else if (!strcmp(v, "f16"))
      p->cache_type = PAGODA_CACHE_TYPE_F16;
    else if (!strcmp(v, "bf16"))
      p->cache_type = PAGODA_CACHE_TYPE_BF16;
    else {
      fprintf(stderr, "error: --pa-cache-type must be auto, f32, f16, bf16 or f8e4m3, got '%s'\n", v);
      return -1;
    }
    return 1;
  }
  ON_FLAG("--prefix-cache-n", i, -1) return flag_int("--prefix-cache-n", v, 0, 1 << 30, &p->prefix_cache_n) ? -1 : 1;
  ON_FLAG("--max-num-seqs", i, -1) return flag_int("--max-num-seqs", v, 1, 1 << 20, &p->max_num_seqs) ? -1 : 1;
  ON_FLAG("--max-num-batched-tokens", i, -1)
  return flag_int("--max-num-batched-tokens", v, 1, 1 << 24, &p->max_num_batched_tokens) ? -1 : 1;
  ON_FLAG("--prefill-chunk-size", i, -1)
  return flag_int("--prefill-chunk-size", v, 1, 1 << 24, &p->prefill_chunk_size) ? -1 : 1;
  ON_FLAG("--max-model-len", i, -1) return flag_int("--max-model-len", v, 1, 1 << 30, &p->max_model_len) ? -1 : 1;
  return 0;
}

int engine_flags_check(const struct pagoda_engine_params *p) {
  int n = (p->pa_memory_mb > 0) + (p->pa_memory_fraction > 0) + (p->pa_context_len > 0);
  if (n > 1) {
    fprintf(stderr, "error: --pa-memory-mb, --pa-memory-fraction and --pa-context-len are mutually exclusive: "
                    "give at most one\n");
    return -1;
  }
  return 0;
}

static const char *cache_type_name(enum pagoda_cache_type t) {
  switch (t) {
  case PAGODA_CACHE_TYPE_F32: return "f32";
  case PAGODA_CACHE_TYPE_F16: return "f16";
  case PAGODA_CACHE_TYPE_BF16: return "bf16";
  case PAGODA_CACHE_TYPE_F8E4M3: return "f8e4m3";
  default: return "auto";
  }
}

void engine_flags_usage(FILE *f, const struct pagoda_engine_params *d) {
  fprintf(f,
          "engine options:\n"
          "  -m, --model PATH|ORG/NAME     model: HF directory (config.json + safetensors), .gguf file, or a\n"
          "                                Hugging Face repo id (cache, else download; docs/model-formats.md);\n"
          "                                default: $PAGODA_MODEL, else SmolLM2-135M-Instruct Q4_1\n"
          "                                (fetched by scripts/setup.sh --model)\n"
          "  --revision REV                repo id: branch, tag or commit (default main)\n"
          "  --hf-file FILE                repo id: use this file of the repo (e.g. model-Q8_0.gguf)\n"
          "  --device cpu|cuda             default: %s\n"
          "  -t, --threads N               CPU threads at most (default %d%s)\n"
          "  --tp N                        tensor parallelism over N GPUs of this host, one thread each\n"
          "                                (default $PAGODA_TP, else 1; docs/distributed.md)\n"
          "  --tp-rank R --tp-world W --tp-master HOST:PORT\n"
          "                                multi-process tensor parallelism: this process is rank R of W,\n"
          "                                one GPU each, joined at rank 0's HOST:PORT; rank 0 runs the\n"
          "                                command, ranks > 0 serve its model calls until it ends (default\n"
          "                                $PAGODA_TP_RANK / $PAGODA_TP_WORLD / $PAGODA_TP_MASTER)\n"
          "  --isq q4_0|q4_k|q5_k|q6_k|q8_0|4|8\n"
          "                                quantize float weights at load (4 = q4_k, 8 = q8_0)\n"
          "  --paged-attn auto|on|off      PagedAttention block pool (default %s; auto = on); off: contiguous cache\n"
          "  --pa-block-size 8|16|32       tokens per KV block (default %d)\n"
          "  --pa-memory-mb N              KV pool size in MiB            } at most one; default: 90%% of\n"
          "  --pa-memory-fraction F        fraction of free memory (0,1]  } the memory left after the\n"
          "  --pa-context-len N            room for max-num-seqs x N tokens } weights\n"
          "  --pa-cache-type auto|f32|f16|bf16|f8e4m3\n"
          "                                KV dtype (default %s; auto: f16 for GGUF on CPU, else compute dtype)\n"
          "  --prefix-cache-n N            prefix caching (default %d; 0 disables)\n"
          "  --max-num-seqs N              sequences per step (default %d)\n"
          "  --max-num-batched-tokens N    tokens per step (default %d)\n"
          "  --prefill-chunk-size N        prompt tokens per sequence per step (default %d)\n"
          "  --max-model-len N             longest prompt + output (default: %s)\n",
          d->device ? d->device : "cuda when a GPU is present, else cpu", d->threads,
          d->threads ? "" : " = all idle cores",
          d->paged_attn == PAGODA_PAGED_ATTN_ON ? "on" : d->paged_attn == PAGODA_PAGED_ATTN_OFF ? "off" : "auto",
          d->block_size, cache_type_name(d->cache_type), d->prefix_cache_n, d->max_num_seqs,
          d->max_num_batched_tokens, d->prefill_chunk_size, "the model's context");
}
