/* test_model_file.c - model_file_open on stories260K.gguf and on the transformers fixtures. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "model/config.h"
#include "model/model_file.h"
#include "test_util.h"
#include "util/log.h"

static void check_tensor(const struct host_tensor *t, enum dtype dt, int64_t rows, int64_t cols,
                         const char *what) {
  CHECK(t->data != NULL, "%s present", what);
  CHECK(t->dtype == dt, "%s dtype %s, want %s", what, dtype_name(t->dtype), dtype_name(dt));
  CHECK(t->rows == rows && t->cols == cols, "%s shape (%lld, %lld), want (%lld, %lld)", what,
        (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
}

/* Every layer's tensors have the shapes the config implies. */
static void check_layers(const struct model_file *f) {
  const struct model_config *c = &f->config;
  int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
  for (int i = 0; i < c->n_layers; i++) {
    const struct layer_tensors *L = &f->layers[i];
    char w[64];
#define LT(field, dt, r, cc)                           \
  snprintf(w, sizeof w, "%s layer %d " #field, c->arch, i); \
  check_tensor(&L->field, dt, r, cc, w);
    LT(attn_norm, L->attn_norm.dtype, 1, c->dim)
    LT(wq, c->weight_dtype, q, c->dim)
    LT(wk, c->weight_dtype, kv, c->dim)
    LT(wv, c->weight_dtype, kv, c->dim)
    LT(wo, c->weight_dtype, c->dim, q)
    LT(ffn_norm, L->ffn_norm.dtype, 1, c->dim)
    LT(w_gate, c->weight_dtype, c->ffn_dim, c->dim)
    LT(w_up, c->weight_dtype, c->ffn_dim, c->dim)
    LT(w_down, c->weight_dtype, c->dim, c->ffn_dim)
    if (c->qkv_bias) {
      LT(bq, L->bq.dtype, 1, q)
      LT(bk, L->bk.dtype, 1, kv)
      LT(bv, L->bv.dtype, 1, kv)
    } else {
      CHECK(!L->bq.data && !L->bk.data && !L->bv.data, "%s layer %d has no biases", c->arch, i);
    }
#undef LT
  }
}

static int check_stories(const char *path) {
  struct model_file *f = model_file_open(path);
  REQUIRE(f != NULL, "open %s: %s", path, err_last());
  const struct model_config *c = &f->config;
  /* The values stored in the file's metadata (llama.context_length 2048, eps 1e-5f, ...). */
  CHECK(!strcmp(c->arch, "llama"), "arch %s", c->arch);
  CHECK(c->dim == 64 && c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4, "dims");
  CHECK(c->head_dim == 8 && c->ffn_dim == 172 && c->vocab_size == 512, "head_dim %d ffn %d vocab %d",
        c->head_dim, c->ffn_dim, c->vocab_size);
  CHECK(c->max_seq_len == 2048, "context %d", c->max_seq_len);
  CHECK(c->rms_eps == 1e-5f, "rms eps %g", (double)c->rms_eps);
  CHECK(c->rope_theta == 10000.0f, "rope theta %g", (double)c->rope_theta);
  CHECK(c->rope_neox == 0 && c->rope_scaling == ROPE_SCALING_NONE, "interleaved rope, unscaled");
  CHECK(c->qkv_bias == 0, "no biases");
  CHECK(c->bos_id == 1 && c->eos_id == 2, "bos %d eos %d", c->bos_id, c->eos_id);
  CHECK(c->weight_dtype == DTYPE_F32, "f32 weights");
  check_tensor(&f->tok_embd, DTYPE_F32, 512, 64, "token_embd");
  check_tensor(&f->out_norm, DTYPE_F32, 1, 64, "output_norm");
  check_tensor(&f->lm_head, DTYPE_F32, 512, 64, "output");
  /* stories260K stores output.weight: the classifier is not tied to the embeddings. */
  CHECK(c->tie_embeddings == 0 && f->lm_head.data != f->tok_embd.data, "untied");
  CHECK(f->rope_freqs.data == NULL, "no rope_freqs");
  check_layers(f);
  /* The first embedding row is the stored f32 values: spot-check against the raw bytes' sum of
   * squares being finite and non-zero (a trained model). */
  const float *e = f->tok_embd.data;
  double ss = 0;
  for (int i = 0; i < 512 * 64; i++)
    ss += (double)e[i] * e[i];
  CHECK(ss > 1 && isfinite(ss), "embeddings are real numbers (sum sq %g)", ss);
  model_file_close(f);
  return 0;
}

static const char *json_str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}
static double json_num(const cJSON *o, const char *k, double dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (cJSON_IsArray(v))
    v = cJSON_GetArrayItem(v, 0);
  return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* A transformers fixture: the config fields against config.json read independently here, and
 * every tensor's shape against them. */
static int check_fixture(const char *name) {
  char dir[512], cfg[600];
  snprintf(dir, sizeof dir, "%s", test_fixture_path(name));
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  size_t len;
  char *text = test_read_file(cfg, &len);
  if (!text) {
    printf("fixture %s absent, skipped\n", name);
    return 0;
  }
  cJSON *j = cJSON_ParseWithLength(text, len);
  free(text);
  REQUIRE(j != NULL, "%s parses", cfg);
  struct model_file *f = model_file_open(dir);
  CHECK(f != NULL, "open %s: %s", dir, err_last());
  if (!f) {
    cJSON_Delete(j);
    return 1;
  }
  const struct model_config *c = &f->config;
  const char *arch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring;
  const char *want_arch = !strcmp(arch, "Qwen2ForCausalLM")     ? "qwen2"
                          : !strcmp(arch, "MistralForCausalLM") ? "mistral"
                                                                : "llama";
  CHECK(!strcmp(c->arch, want_arch), "%s arch %s", name, c->arch);
  int heads = (int)json_num(j, "num_attention_heads", -1);
  CHECK(c->vocab_size == (int)json_num(j, "vocab_size", -1), "%s vocab", name);
  CHECK(c->dim == (int)json_num(j, "hidden_size", -1), "%s dim", name);
  CHECK(c->ffn_dim == (int)json_num(j, "intermediate_size", -1), "%s ffn", name);
  CHECK(c->n_layers == (int)json_num(j, "num_hidden_layers", -1), "%s layers", name);
  CHECK(c->n_heads == heads, "%s heads", name);
  CHECK(c->n_kv_heads == (int)json_num(j, "num_key_value_heads", heads), "%s kv heads", name);
  CHECK(c->head_dim == (int)json_num(j, "head_dim", c->dim / heads), "%s head_dim %d", name,
        c->head_dim);
  CHECK(c->max_seq_len == (int)json_num(j, "max_position_embeddings", -1), "%s ctx", name);
  CHECK(c->rms_eps == (float)json_num(j, "rms_norm_eps", -1), "%s eps", name);
  /* transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x rope_theta and
   * rope_scaling. */
  const cJSON *rp = cJSON_GetObjectItem(j, "rope_parameters");
  double theta = json_num(rp, "rope_theta", json_num(j, "rope_theta", 10000));
  CHECK(c->rope_theta == (float)theta, "%s theta %g", name, (double)c->rope_theta);
  CHECK(c->rope_neox == 1, "%s neox rope", name);
  CHECK(c->bos_id == (int)json_num(j, "bos_token_id", -1), "%s bos", name);
  CHECK(c->eos_id == (int)json_num(j, "eos_token_id", -1), "%s eos", name);
  CHECK(c->qkv_bias == !strcmp(want_arch, "qwen2"), "%s biases", name);
  const cJSON *tie = cJSON_GetObjectItem(j, "tie_word_embeddings");
  CHECK(c->tie_embeddings == cJSON_IsTrue(tie), "%s tie %d", name, c->tie_embeddings);
  CHECK((f->lm_head.data == f->tok_embd.data) == c->tie_embeddings, "%s lm_head tying", name);
  const cJSON *rs = cJSON_IsObject(rp) ? rp : cJSON_GetObjectItem(j, "rope_scaling");
  const char *rtype = json_str(rs, "rope_type");
  if (cJSON_IsObject(rs) && !(rtype && !strcmp(rtype, "default"))) {
    const char *t = json_str(rs, "rope_type") ? json_str(rs, "rope_type") : json_str(rs, "type");
    CHECK(t && !strcmp(t, "llama3") && c->rope_scaling == ROPE_SCALING_LLAMA3, "%s llama3", name);
    CHECK(c->rope_factor == (float)json_num(rs, "factor", -1), "%s factor", name);
    CHECK(c->rope_low_freq_factor == (float)json_num(rs, "low_freq_factor", -1), "%s low", name);
    CHECK(c->rope_high_freq_factor == (float)json_num(rs, "high_freq_factor", -1), "%s hi", name);
    CHECK(c->rope_orig_max_pos == (int)json_num(rs, "original_max_position_embeddings", -1),
          "%s orig max pos", name);
  } else {
    CHECK(c->rope_scaling == ROPE_SCALING_NONE, "%s unscaled", name);
  }
  const char *td = json_str(j, "torch_dtype") ? json_str(j, "torch_dtype") : json_str(j, "dtype");
  enum dtype want_dt = td && !strcmp(td, "bfloat16") ? DTYPE_BF16 : DTYPE_F32;
  CHECK(c->weight_dtype == want_dt, "%s weight dtype %s", name, dtype_name(c->weight_dtype));
  check_tensor(&f->tok_embd, want_dt, c->vocab_size, c->dim, "embed");
  check_tensor(&f->out_norm, want_dt, 1, c->dim, "norm");
  check_tensor(&f->lm_head, want_dt, c->vocab_size, c->dim, "lm_head");
  check_layers(f);
  model_file_close(f);
  cJSON_Delete(j);
  return 0;
}

/* ---- damaged copies: every problem is an error naming the file and the tensor ---- */

static char tmpdir[64];

static int write_file(const char *path, const void *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp)
    return -1;
  size_t w = fwrite(data, 1, n, fp);
  fclose(fp);
  return w == n ? 0 : -1;
}

/* Offset of the first occurrence of the length-prefixed GGUF string S in B, or 0. */
static size_t find_gguf_name(const unsigned char *b, size_t n, const char *s) {
  size_t l = strlen(s);
  for (size_t i = 8; i + l <= n; i++)
    if (!memcmp(b + i, s, l) && !memcmp(b + i - 8, &(uint64_t){l}, 8))
      return i;
  return 0;
}

/* Opens a copy of stories260K with EDIT applied; expects failure naming the file and WANT. */
static void gguf_case(const unsigned char *orig, size_t n, const char *tensor, int set_type,
                      const char *rename_to, const char *want) {
  unsigned char *b = malloc(n);
  memcpy(b, orig, n);
  size_t at = find_gguf_name(b, n, tensor);
  CHECK(at != 0, "tensor info of %s found", tensor);
  if (!at) {
    free(b);
    return;
  }
  if (rename_to)
    memcpy(b + at, rename_to, strlen(rename_to));
  if (set_type >= 0) {
    uint32_t nd;
    memcpy(&nd, b + at + strlen(tensor), 4);
    uint32_t t = (uint32_t)set_type;
    memcpy(b + at + strlen(tensor) + 4 + 8 * nd, &t, 4);
  }
  char path[128];
  snprintf(path, sizeof path, "%s/damaged.gguf", tmpdir);
  write_file(path, b, n);
  struct model_file *f = model_file_open(path);
  if (!want) { /* a case that must load */
    CHECK(f != NULL, "%s: %s", path, err_last());
    if (f) /* output.weight renamed away: the classifier is tied to the embeddings */
      CHECK(f->config.tie_embeddings && f->lm_head.data == f->tok_embd.data, "tied");
  } else {
    CHECK(f == NULL, "damaged %s accepted", tensor);
    CHECK(f || (strstr(err_last(), path) && strstr(err_last(), want)),
          "message should name %s and '%s': %s", path, want, err_last());
  }
  model_file_close(f);
  unlink(path);
  free(b);
}

static void test_damaged_gguf(const char *stories) {
  size_t n;
  unsigned char *orig = (unsigned char *)test_read_file(stories, &n);
  if (!orig)
    return;
  /* A missing tensor (renamed to a same-length name). */
  gguf_case(orig, n, "blk.3.ffn_up.weight", -1, "blk.3.ffn_uX.weight", "'blk.3.ffn_up.weight'");
  gguf_case(orig, n, "output_norm.weight", -1, "output_norX.weight", "'output_norm.weight'");
  /* A norm vector in Q8_0 (64 values = 2 blocks, so the file itself stays valid). */
  gguf_case(orig, n, "blk.0.attn_norm.weight", 8, NULL, "Q8_0");
  /* A ggml type pagoda cannot read (IQ2_XXS = 16): named by id and name. */
  gguf_case(orig, n, "blk.1.attn_q.weight", 16, NULL, "ggml type 16 (IQ2_XXS)");
  /* Q4_K rows must be whole super-blocks: attn_q's rows of 64 are not. */
  gguf_case(orig, n, "blk.1.attn_q.weight", 12, NULL, "not a multiple of its block size 256");
  /* Without output.weight the model loads tied. */
  gguf_case(orig, n, "output.weight", -1, "outpuX.weight", NULL);
  free(orig);
}

/* Copies fixture NAME into tmpdir/NAME (config.json and model.safetensors), letting EDIT_CONFIG
 * replace config.json's text and SHIFT pad the safetensors header by that many bytes (moving
 * the data off its alignment). Returns the directory. */
static const char *copy_fixture(const char *name, const char *find, const char *repl, int shift) {
  static char dir[256];
  char src[600], dst[600];
  snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
  mkdir(dir, 0700);
  snprintf(src, sizeof src, "%s/config.json", test_fixture_path(name));
  size_t n;
  char *cfg = test_read_file(src, &n);
  if (!cfg)
    return NULL;
  if (find) {
    char *at = strstr(cfg, find);
    CHECK(at != NULL, "'%s' in %s", find, src);
    if (at) {
      size_t fl = strlen(find), rl = strlen(repl);
      char *nc = malloc(n - fl + rl + 1);
      memcpy(nc, cfg, (size_t)(at - cfg));
      memcpy(nc + (at - cfg), repl, rl);
      memcpy(nc + (at - cfg) + rl, at + fl, n - (size_t)(at - cfg) - fl + 1);
      free(cfg);
      cfg = nc;
      n = n - fl + rl;
    }
  }
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  write_file(dst, cfg, n);
  free(cfg);
  snprintf(src, sizeof src, "%s/model.safetensors", test_fixture_path(name));
  unsigned char *st = (unsigned char *)test_read_file(src, &n);
  if (!st)
    return NULL;
  uint64_t hl;
  memcpy(&hl, st, 8);
  unsigned char *out = malloc(n + (size_t)shift);
  uint64_t nhl = hl + (uint64_t)shift;
  memcpy(out, &nhl, 8);
  memcpy(out + 8, st + 8, hl);
  memset(out + 8 + hl, ' ', (size_t)shift);
  memcpy(out + 8 + hl + shift, st + 8 + hl, n - 8 - hl);
  snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
  write_file(dst, out, n + (size_t)shift);
  free(st);
  free(out);
  return dir;
}

static void remove_copy(const char *dir) {
  char p[600];
  snprintf(p, sizeof p, "%s/config.json", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  unlink(p);
  rmdir(dir);
}

static void test_damaged_hf(void) {
  struct model_file *orig = model_file_open(test_fixture_path("qwen2"));
  if (!orig)
    return;
  /* Data moved off alignment (header padded by 1 byte): loads, copies, same values. */
  const char *dir = copy_fixture("qwen2", NULL, NULL, 1);
  struct model_file *f = dir ? model_file_open(dir) : NULL;
  CHECK(f != NULL, "misaligned copy opens: %s", err_last());
  if (f) {
    CHECK((uintptr_t)f->layers[1].w_down.data % 4 == 0, "aligned copy");
    CHECK(!memcmp(f->layers[1].w_down.data, orig->layers[1].w_down.data,
                  (size_t)(f->config.dim * f->config.ffn_dim * 4)), "same values");
    CHECK(!memcmp(f->layers[0].bk.data, orig->layers[0].bk.data,
                  (size_t)(f->config.n_kv_heads * f->config.head_dim * 4)), "same biases");
  }
  model_file_close(f);
  if (dir)
    remove_copy(dir);
  /* Config and tensors that disagree: the first tensor whose shape differs is named. */
  struct {
    const char *find, *repl, *want;
  } bad[] = {
      {"\"intermediate_size\": 160", "\"intermediate_size\": 161", "model.layers.0.mlp.gate_proj.weight"},
      {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", "model.layers.0.self_attn.k_proj.weight"},
      {"\"vocab_size\": 256", "\"vocab_size\": 300", "model.embed_tokens.weight"},
      {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3", "'model.layers.2.input_layernorm.weight' is missing"},
      {"\"hidden_size\": 64", "\"hidden_size\": 32", "model.embed_tokens.weight"},
      {"Qwen2ForCausalLM", "GPTNeoXForCausalLM", "GPTNeoXForCausalLM"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dir = copy_fixture("qwen2", bad[i].find, bad[i].repl, 0);
    if (!dir)
      continue;
    f = model_file_open(dir);
    CHECK(f == NULL, "%s accepted", bad[i].repl);
    CHECK(f || (strstr(err_last(), dir) && strstr(err_last(), bad[i].want)),
          "message should name %s and '%s': %s", dir, bad[i].want, err_last());
    model_file_close(f);
    remove_copy(dir);
  }
  /* A Llama config over Qwen2 weights: no biases are asked for, so it loads; the reverse (a
   * Qwen2 config over Llama weights) misses the biases. */
  dir = copy_fixture("llama", "LlamaForCausalLM", "Qwen2ForCausalLM", 0);
  f = dir ? model_file_open(dir) : NULL;
  CHECK(f == NULL && strstr(err_last(), "model.layers.0.self_attn.q_proj.bias"),
        "qwen2 config over llama weights: %s", err_last());
  model_file_close(f);
  if (dir)
    remove_copy(dir);
  model_file_close(orig);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/pagoda_mf_XXXXXX");
  if (!mkdtemp(tmpdir))
    return test_skip("cannot make a temporary directory");
  const char *p = test_shared_path("models/stories260K.gguf");
  if (p) {
    check_stories(p);
    test_damaged_gguf(p);
  } else
    printf("shared testdata absent: stories260K checks skipped\n");
  const char *fixtures[] = {"llama", "llama3", "llama_hd", "mistral", "qwen2", "llama_bf16",
                            "llama_sharded"};
  for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++)
    check_fixture(fixtures[i]);

  test_damaged_hf();
  rmdir(tmpdir);
  struct model_file *bad = model_file_open("/nonexistent/model.gguf");
  CHECK(bad == NULL && strstr(err_last(), "/nonexistent/model.gguf"), "missing path named: %s",
        err_last());
  bad = model_file_open("/tmp");
  CHECK(bad == NULL && strstr(err_last(), "config.json"), "directory without config: %s",
        err_last());
  return test_finish("test_model_file");
}
