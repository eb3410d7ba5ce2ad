/* cpu_forward.c - end-to-end CPU forward speed on a random-weight model of Llama-3.2-1B's shape:
 * prefill tokens/s and decode tokens/s, with the weight bytes each decode step streams and the
 * machine's copy bandwidth measured in the same run.
 *
 * Usage: cpu_forward DIR [threads] [f32|bf16] [prompt_len] [decode_steps] [layers]
 * Writes DIR (config.json + model.safetensors, random weights) when DIR/config.json is absent.
 * Random weights are fine for speed: the work per token does not depend on the values.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_util.h"
#include "backend/backend.h"
#include "model/model.h"
#include "util/log.h"

/* Llama-3.2-1B */
#define DIM 2048
#define HEADS 32
#define KV_HEADS 8
#define HEAD_DIM 64
#define FFN 8192
#define VOCAB 128256

struct tensor_spec {
  char name[96];
  long rows, cols; /* rows = 1: a vector of cols */
};

static int write_model(const char *dir, int bf16, int layers) {
  mkdir(dir, 0755);
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f)
    return -1;
  fprintf(f,
          "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": %d, "
          "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
          "\"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-05, "
          "\"rope_theta\": 500000.0, \"max_position_embeddings\": 131072, \"tie_word_embeddings\": true, "
          "\"hidden_act\": \"silu\", \"bos_token_id\": 128000, \"eos_token_id\": 128001, "
          "\"torch_dtype\": \"%s\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, "
          "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}\n",
          DIM, FFN, layers, HEADS, KV_HEADS, HEAD_DIM, VOCAB, bf16 ? "bfloat16" : "float32");
  fclose(f);
  int n = 2 + 9 * layers;
  struct tensor_spec *ts = calloc((size_t)n, sizeof *ts);
  int k = 0;
  ts[k++] = (struct tensor_spec){"model.embed_tokens.weight", VOCAB, DIM};
  ts[k++] = (struct tensor_spec){"model.norm.weight", 1, DIM};
  for (int l = 0; l < layers; l++) {
    const char *sfx[9] = {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                          "mlp.down_proj"};
    long shape[9][2] = {{1, DIM}, {HEADS * HEAD_DIM, DIM}, {KV_HEADS * HEAD_DIM, DIM}, {KV_HEADS * HEAD_DIM, DIM},
                        {DIM, HEADS * HEAD_DIM}, {1, DIM}, {FFN, DIM}, {FFN, DIM}, {DIM, FFN}};
    for (int i = 0; i < 9; i++) {
      snprintf(ts[k].name, sizeof ts[k].name, "model.layers.%d.%s.weight", l, sfx[i]);
      ts[k].rows = shape[i][0];
      ts[k].cols = shape[i][1];
      k++;
    }
  }
  size_t es = bf16 ? 2 : 4, hcap = (size_t)n * 160 + 64, hl = 0, off = 0;
  char *hdr = malloc(hcap);
  hl += (size_t)snprintf(hdr + hl, hcap - hl, "{");
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)ts[i].rows * ts[i].cols * es;
    if (ts[i].rows == 1)
      hl += (size_t)snprintf(hdr + hl, hcap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%ld],\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", ts[i].name, bf16 ? "BF16" : "F32", ts[i].cols, off, off + bytes);
    else
      hl += (size_t)snprintf(hdr + hl, hcap - hl,
                             "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%ld,%ld],\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", ts[i].name, bf16 ? "BF16" : "F32", ts[i].rows, ts[i].cols, off,
                             off + bytes);
    off += bytes;
  }
  hl += (size_t)snprintf(hdr + hl, hcap - hl, "}");
  while (hl % 8)
    hdr[hl++] = ' ';
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  f = fopen(path, "wb");
  if (!f)
    return -1;
  uint64_t hl64 = hl;
  fwrite(&hl64, 8, 1, f);
  fwrite(hdr, 1, hl, f);
  uint64_t r = 0x2545f4914f6cdd1dull;
  size_t chunk = 1 << 20;
  unsigned char *buf = malloc(chunk * 4);
  for (int i = 0; i < n; i++) {
    size_t count = (size_t)ts[i].rows * ts[i].cols;
    for (size_t done = 0; done < count;) {
      size_t m = count - done < chunk ? count - done : chunk;
      for (size_t j = 0; j < m; j++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        /* norms 1, matrices uniform in [-0.04, 0.04]: activations stay in range */
        float v = ts[i].rows == 1 ? 1.0f : ((float)(r % 2001) / 1000.0f - 1.0f) * 0.04f;
        if (bf16) {
          uint16_t h = f32_to_bf16(v);
          memcpy(buf + j * 2, &h, 2);
        } else {
          memcpy(buf + j * 4, &v, 4);
        }
      }
      fwrite(buf, es, m, f);
      done += m;
    }
  }
  fclose(f);
  free(buf);
  free(hdr);
  free(ts);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cpu_forward DIR [threads] [f32|bf16] [prompt_len] [decode_steps] [layers]\n");
    return 2;
  }
  const char *dir = argv[1];
  int threads = argc > 2 ? atoi(argv[2]) : 0;
  int bf16 = argc > 3 ? strcmp(argv[3], "f32") != 0 : 1;
  int P = argc > 4 ? atoi(argv[4]) : 128;
  int G = argc > 5 ? atoi(argv[5]) : 16;
  int layers = argc > 6 ? atoi(argv[6]) : 16;
  char probe[4096];
  snprintf(probe, sizeof probe, "%s/config.json", dir);
  struct stat st;
  if (stat(probe, &st) != 0 && write_model(dir, bf16, layers) != 0) {
    fprintf(stderr, "cannot write %s\n", dir);
    return 1;
  }
  struct backend *be = backend_cpu_create(threads);
  struct model *m = be ? model_load(dir, be) : NULL;
  if (!m) {
    fprintf(stderr, "%s\n", err_last_where());
    return 1;
  }
  const struct model_config *c = model_get_config(m);
  const int bs = 32, max_blocks = (P + G + bs - 1) / bs;
  if (model_alloc_cache(m, max_blocks + 1, bs, DTYPE_F32, P, 1, max_blocks) != 0) {
    fprintf(stderr, "%s\n", err_last_where());
    return 1;
  }
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)P * 3), *pos = ids + P, *slots = pos + P;
  int32_t table[4096], qs[2], len, li;
  for (int i = 0; i < max_blocks; i++)
    table[i] = i + 1;
  for (int i = 0; i < P; i++) {
    ids[i] = (i * 7919 + 13) % c->vocab_size;
    pos[i] = i;
    slots[i] = table[i / bs] * bs + i % bs;
  }
  float *logits = malloc(sizeof(float) * c->vocab_size);
  qs[0] = 0;
  qs[1] = P;
  len = P;
  li = P - 1;
  struct batch b = {P, 1, max_blocks, P, P, ids, pos, slots, qs, &len, table, 1, &li};
  double t0 = bench_now();
  if (model_forward(m, &b, logits) != 0) {
    fprintf(stderr, "%s\n", err_last_where());
    return 1;
  }
  double t_prefill = bench_now() - t0;
  t0 = bench_now();
  for (int g = 0; g < G; g++) {
    int p = P + g, id = (g * 31 + 5) % c->vocab_size, slot = table[p / bs] * bs + p % bs, one[2] = {0, 1};
    int l2 = p + 1, zero = 0;
    struct batch d = {1, 1, max_blocks, l2, 1, &id, &p, &slot, one, &l2, table, 1, &zero};
    if (model_forward(m, &d, logits) != 0) {
      fprintf(stderr, "%s\n", err_last_where());
      return 1;
    }
  }
  double t_decode = (bench_now() - t0) / G;
  /* bytes of weights one decode step reads: every matrix once (the tied embedding as lm_head) */
  double es = bf16 ? 2 : 4;
  double per_layer = (double)DIM * (HEADS * HEAD_DIM) * 2 + (double)DIM * (KV_HEADS * HEAD_DIM) * 2 + 3.0 * DIM * FFN;
  double wbytes = es * (per_layer * c->n_layers + (double)VOCAB * DIM);
  double copy = bench_copy_gbps(be->num_threads, 1.0);
  printf("cpu_forward: Llama-3.2-1B shape, %d layers, %s weights, %d threads\n", c->n_layers,
         bf16 ? "bf16" : "f32", be->num_threads);
  printf("prefill %d tokens: %.2f s, %.1f tokens/s\n", P, t_prefill, P / t_prefill);
  printf("decode (context %d..%d): %.1f ms/token, %.2f tokens/s, weights %.2f GB/step = %.1f GB/s "
         "(copy bandwidth, read+write, same run: %.1f GB/s)\n",
         P, P + G, t_decode * 1e3, 1.0 / t_decode, wbytes / 1e9, wbytes / t_decode / 1e9, copy);
  free(ids);
  free(logits);
  model_free(m);
  be->ops->destroy(be);
  return 0;
}
