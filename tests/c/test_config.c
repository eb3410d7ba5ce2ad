/* test_config.c - config.json parsing (published configs of real models, transformers 4 and 5
 * layouts, every default and error) and GGUF metadata parsing on small GGUF files built here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/config.h"
#include "test_util.h"
#include "util/log.h"

/* REQUIRE for void functions. */
#define REQUIRE_V(cond)                          \
  do {                                           \
    int before_ = test_failures;                 \
    CHECK(cond, "%s", err_last());               \
    if (test_failures != before_)                \
      return;                                    \
  } while (0)

static char *seed_text(const char *file) {
  const char *src = getenv("PAGODA_SOURCE_DIR");
  char p[1024];
  snprintf(p, sizeof p, "%s/tests/fuzz/seeds/fuzz_model_config/%s", src ? src : ".", file);
  size_t len;
  char *t = test_read_file(p, &len);
  CHECK(t != NULL, "read %s", p);
  return t;
}

/* Parses TEXT after applying EDIT ("key=json" replaces or adds a top-level key; "key=" removes
 * it). Returns the parser's status. */
static int parse_edited(struct model_config *c, const char *text, const char *edit) {
  cJSON *j = cJSON_Parse(text);
  if (edit) {
    char key[128];
    const char *eq = strchr(edit, '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - edit), edit);
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    if (eq[1])
      cJSON_AddItemToObject(j, key, cJSON_Parse(eq + 1));
  }
  char *s = cJSON_PrintUnformatted(j);
  int rc = config_from_hf_json(c, s, strlen(s), "edited/config.json");
  free(s);
  cJSON_Delete(j);
  return rc;
}

static void test_published(void) {
  struct model_config c;
  char *t = seed_text("llama31_8b_instruct.json");
  if (t) {
    REQUIRE_V(config_from_hf_json(&c, t, strlen(t), "llama31/config.json") == 0);
    CHECK(!strcmp(c.arch, "llama") && c.dim == 4096 && c.n_layers == 32 && c.n_heads == 32 &&
              c.n_kv_heads == 8 && c.head_dim == 128 && c.ffn_dim == 14336,
          "llama 3.1 8B shapes");
    CHECK(c.vocab_size == 128256 && c.max_seq_len == 131072, "vocab, context");
    CHECK(c.rms_eps == 1e-5f && c.rope_theta == 500000.0f && c.rope_neox == 1, "eps, theta");
    CHECK(c.rope_scaling == ROPE_SCALING_LLAMA3 && c.rope_factor == 8.0f &&
              c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f &&
              c.rope_orig_max_pos == 8192,
          "llama3 rope scaling");
    CHECK(c.tie_embeddings == 0 && c.qkv_bias == 0, "untied, no biases");
    CHECK(c.bos_id == 128000 && c.eos_id == 128001, "bos %d, first eos %d", c.bos_id, c.eos_id);
    CHECK(c.weight_dtype == DTYPE_BF16, "torch_dtype bfloat16");
    /* The old spelling "type" and linear scaling; unsupported types name the file and type. */
    CHECK(parse_edited(&c, t, "rope_scaling={\"type\":\"linear\",\"factor\":4}") == 0 &&
              c.rope_scaling == ROPE_SCALING_LINEAR && c.rope_factor == 4.0f,
          "linear scaling: %s", err_last());
    CHECK(parse_edited(&c, t, "rope_scaling={\"rope_type\":\"default\"}") == 0 &&
              c.rope_scaling == ROPE_SCALING_NONE, "default scaling");
    CHECK(parse_edited(&c, t, "rope_scaling=null") == 0 && c.rope_scaling == ROPE_SCALING_NONE,
          "null scaling");
    CHECK(parse_edited(&c, t, "rope_scaling={\"rope_type\":\"yarn\",\"factor\":4}") != 0 &&
              strstr(err_last(), "edited/config.json") && strstr(err_last(), "yarn"),
          "yarn refused: %s", err_last());
    CHECK(parse_edited(&c, t, "rope_scaling={\"rope_type\":\"llama3\",\"factor\":8}") != 0 &&
              strstr(err_last(), "low_freq_factor"), "llama3 needs its factors: %s", err_last());
    /* Defaults. */
    CHECK(parse_edited(&c, t, "num_key_value_heads=") == 0 && c.n_kv_heads == 32, "kv = heads");
    CHECK(parse_edited(&c, t, "rope_theta=") == 0 && c.rope_theta == 10000.0f, "theta default");
    CHECK(parse_edited(&c, t, "rms_norm_eps=") == 0 && c.rms_eps == 1e-6f, "eps default");
    CHECK(parse_edited(&c, t, "head_dim=null") == 0 && c.head_dim == 128, "head_dim null");
    CHECK(parse_edited(&c, t, "head_dim=64") == 0 && c.head_dim == 64, "explicit head_dim");
    CHECK(parse_edited(&c, t, "max_position_embeddings=") == 0 && c.max_seq_len == 2048,
          "llama context default");
    CHECK(parse_edited(&c, t, "eos_token_id=null") == 0 && c.eos_id == -1, "null eos");
    CHECK(parse_edited(&c, t, "eos_token_id=7") == 0 && c.eos_id == 7, "int eos");
    CHECK(parse_edited(&c, t, "torch_dtype=") == 0 && c.weight_dtype == DTYPE_F32, "no dtype");
    CHECK(parse_edited(&c, t, "tie_word_embeddings=true") == 0 && c.tie_embeddings == 1, "tie");
    /* Errors name the file and the key or value. */
    struct {
      const char *edit, *want;
    } bad[] = {
        {"architectures=[\"GPT2LMHeadModel\"]", "GPT2LMHeadModel"},
        {"architectures=", "architectures"},
        {"hidden_size=", "hidden_size"},
        {"hidden_size=\"4096\"", "hidden_size"},
        {"num_hidden_layers=0", "num_hidden_layers"},
        {"vocab_size=-5", "vocab_size"},
        {"num_key_value_heads=5", "multiple"},
        {"num_key_value_heads=64", "num_key_value_heads"},
        {"head_dim=7", "odd"},
        {"rms_norm_eps=0", "rms_norm_eps"},
        {"rope_theta=-1", "rope_theta"},
        {"attention_bias=true", "attention_bias"},
        {"mlp_bias=true", "mlp_bias"},
        {"hidden_act=\"gelu\"", "hidden_act"},
        {"torch_dtype=\"float8_e4m3fn\"", "float8_e4m3fn"},
        {"tie_word_embeddings=1", "tie_word_embeddings"},
        {"bos_token_id=\"<s>\"", "bos_token_id"},
        {"rope_scaling=[8]", "rope_scaling"},
        {"hidden_size=1e30", "hidden_size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
      int rc = parse_edited(&c, t, bad[i].edit);
      CHECK(rc != 0, "accepted %s", bad[i].edit);
      CHECK(rc == 0 || (strstr(err_last(), "edited/config.json") && strstr(err_last(), bad[i].want)),
            "%s: message should name the file and '%s': %s", bad[i].edit, bad[i].want, err_last());
    }
    CHECK(config_from_hf_json(&c, t, strlen(t) / 2, "half/config.json") != 0 &&
              strstr(err_last(), "half/config.json"), "truncated JSON: %s", err_last());
    free(t);
  }
  t = seed_text("mistral_7b_v01.json");
  if (t) {
    /* sliding_window 4096 < 32768 is ignored with a warning (documented limitation). */
    REQUIRE_V(config_from_hf_json(&c, t, strlen(t), "mistral/config.json") == 0);
    CHECK(!strcmp(c.arch, "mistral") && c.n_kv_heads == 8 && c.head_dim == 128 &&
              c.rope_theta == 10000.0f && c.max_seq_len == 32768 && c.vocab_size == 32000,
          "mistral 7B");
    CHECK(parse_edited(&c, t, "max_position_embeddings=") == 0 && c.max_seq_len == 131072,
          "mistral context default");
    free(t);
  }
  t = seed_text("qwen25_05b_instruct.json");
  if (t) {
    REQUIRE_V(config_from_hf_json(&c, t, strlen(t), "qwen/config.json") == 0);
    CHECK(!strcmp(c.arch, "qwen2") && c.dim == 896 && c.n_heads == 14 && c.n_kv_heads == 2 &&
              c.head_dim == 64 && c.ffn_dim == 4864 && c.n_layers == 24,
          "qwen2.5 0.5B shapes");
    CHECK(c.qkv_bias == 1 && c.tie_embeddings == 1 && c.rms_eps == 1e-6f &&
              c.rope_theta == 1e6f && c.eos_id == 151645 && c.bos_id == 151643,
          "qwen2.5 biases, tying, eps, theta, ids");
    free(t);
  }
  /* transformers 5 layout: rope_parameters carries rope_theta and the scaling; "dtype". */
  t = seed_text("transformers5_llama3.json");
  if (t) {
    REQUIRE_V(config_from_hf_json(&c, t, strlen(t), "t5/config.json") == 0);
    CHECK(c.rope_theta == 500000.0f && c.rope_scaling == ROPE_SCALING_LLAMA3 &&
              c.rope_orig_max_pos == 64 && c.rope_factor == 8.0f,
          "rope_parameters read");
    CHECK(c.eos_id == 2 && c.tie_embeddings == 1 && c.weight_dtype == DTYPE_F32, "eos list, tie");
    CHECK(parse_edited(&c, t, "rope_parameters={\"rope_theta\":1000}") == 0 &&
              c.rope_theta == 1000.0f && c.rope_scaling == ROPE_SCALING_NONE,
          "rope_parameters without rope_type: %s", err_last());
    CHECK(parse_edited(&c, t, "dtype=\"bfloat16\"") == 0 && c.weight_dtype == DTYPE_BF16,
          "dtype key");
    free(t);
  }
  CHECK(config_from_hf_file(&c, "/nonexistent/config.json") != 0 &&
            strstr(err_last(), "/nonexistent/config.json"), "missing file named");
}

/* Phi-3.5-mini-instruct's published config (longrope, 48 factors per list, sliding_window above
 * the context), Mistral v0.1's window, Qwen3's and Qwen2's window switches, and the errors. */
static void test_arch_fields(void) {
  struct model_config c;
  char *t = seed_text("phi35_mini_instruct.json");
  if (t) {
    REQUIRE_V(config_from_hf_json(&c, t, strlen(t), "phi35/config.json") == 0);
    CHECK(!strcmp(c.arch, "phi3") && c.dim == 3072 && c.n_heads == 32 && c.n_kv_heads == 32 &&
              c.head_dim == 96 && c.rope_dim == 96 && c.ffn_dim == 8192 && c.vocab_size == 32064,
          "phi-3.5 shapes");
    CHECK(c.rope_scaling == ROPE_SCALING_LONGROPE && c.rope_orig_max_pos == 4096 &&
              c.max_seq_len == 131072 && c.sliding_window == 262144 && c.swa_first_layer == 0,
          "phi-3.5 longrope and window");
    /* transformers' _compute_longrope_parameters: sqrt(1 + ln(131072/4096) / ln(4096)) */
    CHECK(fabsf(c.rope_attn_factor - 1.1902380714f) < 1e-6f, "attention factor %.9g",
          (double)c.rope_attn_factor);
    CHECK(c.rope_short_factor[1] == 1.0199999809265137f && c.rope_long_factor[47] == 64.83999633789062f,
          "factors read in order");
    CHECK(parse_edited(&c, t, "partial_rotary_factor=0.75") != 0 && strstr(err_last(), "36"),
          "partial rotary leaves 36 factors per list: %s", err_last());
    CHECK(parse_edited(&c, t, "max_position_embeddings=4096") == 0 && c.rope_attn_factor == 1.0f,
          "no extension: attention factor 1");
    struct {
      const char *edit, *want;
    } bad[] = {
        {"rope_scaling={\"type\":\"longrope\",\"short_factor\":[1,2],\"long_factor\":[1,2]}",
         "48"},
        {"original_max_position_embeddings=", "original_max_position_embeddings"},
        {"partial_rotary_factor=0.01", "partial_rotary_factor"},
        {"partial_rotary_factor=1.5", "partial_rotary_factor"},
        {"sliding_window=-4", "sliding_window"},
        {"rope_scaling={\"type\":\"su\",\"long_factor\":[1]}", "short_factor"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
      int rc = parse_edited(&c, t, bad[i].edit);
      CHECK(rc != 0 && strstr(err_last(), "edited/config.json") && strstr(err_last(), bad[i].want),
            "%s: message should name the file and '%s': %s", bad[i].edit, bad[i].want, err_last());
    }
    free(t);
  }
  t = seed_text("mistral_7b_v01.json");
  if (t) {
    REQUIRE_V(config_from_hf_json(&c, t, strlen(t), "mistral/config.json") == 0);
    CHECK(c.sliding_window == 4096 && c.swa_first_layer == 0, "mistral v0.1 window 4096");
    CHECK(parse_edited(&c, t, "sliding_window=null") == 0 && c.sliding_window == 0, "v0.2: none");
    free(t);
  }
  t = seed_text("qwen25_05b_instruct.json");
  if (t) {
    REQUIRE_V(config_from_hf_json(&c, t, strlen(t), "qwen/config.json") == 0);
    CHECK(c.sliding_window == 0 && c.rope_dim == 64, "qwen2: use_sliding_window false, no window");
    CHECK(parse_edited(&c, t, "partial_rotary_factor=0.75") == 0 && c.rope_dim == 48,
          "partial rotary: %s", err_last());
    CHECK(parse_edited(&c, t, "use_sliding_window=true") == 0 && c.sliding_window == 32768 &&
              c.swa_first_layer == 21,
          "qwen2 window on the layers from max_window_layers: %d from %d", c.sliding_window,
          c.swa_first_layer);
    CHECK(model_kv_window(&c) == 0, "layers 0..20 are global: the KV manager frees nothing");
    c.swa_first_layer = 0;
    CHECK(model_kv_window(&c) == 32768, "every layer windowed: the KV manager may free");
    c.swa_pattern = 2; /* Gemma 2's alternation */
    CHECK(model_kv_window(&c) == 0, "alternating global layers: nothing freed");
    /* Qwen3: the same fields plus head_dim; the class picks the q/k-norm tensor table */
    CHECK(parse_edited(&c, t, "architectures=[\"Qwen3ForCausalLM\"]") == 0 &&
              !strcmp(c.arch, "qwen3") && c.qkv_bias == 0 && c.sliding_window == 0,
          "qwen3: %s", err_last());
    free(t);
  }
}

/* ---- GGUF metadata, on files built here ---- */

struct buf {
  unsigned char *p;
  size_t n, cap;
};
static void put(struct buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void kv_str(struct buf *b, const char *k, const char *v) {
  put_str(b, k);
  put_u32(b, GGUF_TYPE_STRING);
  put_str(b, v);
}
static void kv_u32(struct buf *b, const char *k, uint32_t v) {
  put_str(b, k);
  put_u32(b, GGUF_TYPE_UINT32);
  put_u32(b, v);
}
static void kv_f32(struct buf *b, const char *k, float v) {
  put_str(b, k);
  put_u32(b, GGUF_TYPE_FLOAT32);
  put(b, &v, 4);
}

/* A tensor-less GGUF with ARCH's hyper-parameters; SKIP names a key to leave out, EXTRA_* adds
 * one more string key. */
/* make_gguf adds ARCH.attention.sliding_window = built_window when it is >= 0 */
static int built_window = -1;

static struct gguf_file *make_gguf(struct buf *b, const char *arch, const char *skip,
                                   const char *extra_key, const char *extra_val, int rope_dims) {
  b->n = 0;
  const char *ik[] = {"context_length", "embedding_length", "block_count", "feed_forward_length",
                      "attention.head_count", "attention.head_count_kv",
                      "rope.dimension_count"};
  uint32_t iv[] = {4096, 256, 3, 688, 8, 2, (uint32_t)rope_dims};
  int nkv = 0;
  struct buf kvs = {0};
  kv_str(&kvs, "general.architecture", arch), nkv++;
  char key[128];
  for (int i = 0; i < 7; i++) {
    if (skip && !strcmp(skip, ik[i]))
      continue;
    snprintf(key, sizeof key, "%s.%s", arch, ik[i]);
    kv_u32(&kvs, key, iv[i]), nkv++;
  }
  snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
  kv_f32(&kvs, key, 1e-6f), nkv++;
  snprintf(key, sizeof key, "%s.rope.freq_base", arch);
  kv_f32(&kvs, key, 1e6f), nkv++;
  if (built_window >= 0) {
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    kv_u32(&kvs, key, (uint32_t)built_window), nkv++;
  }
  if (extra_key) {
    snprintf(key, sizeof key, "%s.%s", arch, extra_key);
    kv_str(&kvs, key, extra_val), nkv++;
    if (!strcmp(extra_val, "linear")) {
      snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
      kv_f32(&kvs, key, 4.0f), nkv++;
    }
  }
  /* tokenizer.ggml.tokens: 3 strings. */
  put_str(&kvs, "tokenizer.ggml.tokens");
  put_u32(&kvs, GGUF_TYPE_ARRAY);
  put_u32(&kvs, GGUF_TYPE_STRING);
  put_u64(&kvs, 3);
  put_str(&kvs, "a"), put_str(&kvs, "b"), put_str(&kvs, "c"), nkv++;
  kv_u32(&kvs, "tokenizer.ggml.bos_token_id", 1), nkv++;
  kv_u32(&kvs, "tokenizer.ggml.eos_token_id", 9), nkv++; /* out of range: ignored */
  put_u32(b, 0x46554747u);
  put_u32(b, 3);
  put_u64(b, 0);
  put_u64(b, (uint64_t)nkv);
  put(b, kvs.p, kvs.n);
  free(kvs.p);
  return gguf_open_memory(b->p, b->n, "built.gguf");
}

static void test_gguf(void) {
  struct buf b = {0};
  struct model_config c;
  struct gguf_file *g = make_gguf(&b, "qwen2", NULL, NULL, NULL, 32);
  if (!g) {
    CHECK(0, "built GGUF parses: %s", err_last());
    free(b.p);
    return;
  }
  CHECK(config_from_gguf(&c, g, "built.gguf") == 0, "qwen2 gguf: %s", err_last());
  CHECK(!strcmp(c.arch, "qwen2") && c.rope_neox == 1 && c.qkv_bias == 1, "qwen2: neox, biases");
  CHECK(c.dim == 256 && c.n_layers == 3 && c.ffn_dim == 688 && c.n_heads == 8 &&
            c.n_kv_heads == 2 && c.head_dim == 32 && c.max_seq_len == 4096 && c.vocab_size == 3,
        "qwen2 gguf shapes");
  CHECK(c.rms_eps == 1e-6f && c.rope_theta == 1e6f, "eps, theta");
  CHECK(c.bos_id == 1 && c.eos_id == -1, "bos 1, out-of-range eos dropped");
  CHECK(c.tie_embeddings == 1, "no output.weight: tied");
  gguf_close(g);
  g = make_gguf(&b, "llama", "attention.head_count_kv", "rope.scaling.type", "linear", 32);
  CHECK(g && config_from_gguf(&c, g, "built.gguf") == 0, "llama gguf: %s", err_last());
  CHECK(!strcmp(c.arch, "llama") && c.rope_neox == 0 && c.qkv_bias == 0, "llama: interleaved");
  CHECK(c.n_kv_heads == 8, "kv heads default to heads");
  CHECK(c.rope_scaling == ROPE_SCALING_LINEAR && c.rope_factor == 4.0f, "linear scaling");
  CHECK(c.sliding_window == 0 && model_kv_window(&c) == 0, "llama gguf without the key: no window");
  gguf_close(g);
  built_window = 4096; /* a Mistral v0.1 GGUF that carries its window */
  g = make_gguf(&b, "llama", NULL, NULL, NULL, 32);
  built_window = -1;
  CHECK(g && config_from_gguf(&c, g, "built.gguf") == 0, "llama gguf with a window: %s", err_last());
  CHECK(c.sliding_window == 4096 && model_kv_window(&c) == 4096, "llama.attention.sliding_window on every layer");
  gguf_close(g);
  struct {
    const char *arch, *skip, *ek, *ev;
    int rope_dims;
    const char *want;
  } bad[] = {
      {"gpt2", NULL, NULL, NULL, 32, "gpt2"},
      {"llama", "block_count", NULL, NULL, 32, "llama.block_count"},
      {"llama", "embedding_length", NULL, NULL, 32, "llama.embedding_length"},
      {"llama", NULL, NULL, NULL, 16, "partial RoPE"},
      {"llama", NULL, "rope.scaling.type", "yarn", 32, "yarn"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    g = make_gguf(&b, bad[i].arch, bad[i].skip, bad[i].ek, bad[i].ev, bad[i].rope_dims);
    int rc = g ? config_from_gguf(&c, g, "built.gguf") : -1;
    CHECK(rc != 0, "bad gguf %zu accepted", i);
    CHECK(strstr(err_last(), "built.gguf") && strstr(err_last(), bad[i].want),
          "bad gguf %zu: message should name the file and '%s': %s", i, bad[i].want, err_last());
    gguf_close(g);
  }
  free(b.p);
}

int main(void) {
  log_set_level(LOG_LEVEL_ERROR);
  test_published();
  test_arch_fields();
  test_gguf();
  return test_finish("test_config");
}
