/* config.c - model hyper-parameters from HF config.json (cJSON) and from GGUF metadata. */
#include "model/config.h"

#include "model/arch.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/file.h"
#include "util/log.h"

/* Defaults taken by transformers' config classes when a key is absent. */
#define DEFAULT_ROPE_THETA 10000.0f
#define DEFAULT_RMS_EPS 1e-6f

static void config_defaults(struct model_config *c) {
  memset(c, 0, sizeof *c);
  c->rms_eps = DEFAULT_RMS_EPS;
  c->rope_theta = DEFAULT_ROPE_THETA;
  c->rope_scaling = ROPE_SCALING_NONE;
  c->rope_factor = 1.0f;
  c->rope_attn_factor = 1.0f;
  c->weight_dtype = DTYPE_F32;
  c->bos_id = -1;
  c->eos_id = -1;
}

/* Checks that hold for every source: sizes positive and bounded, heads dividing evenly. */
static int config_validate(const struct model_config *c, const char *name) {
#define RANGE(field, key, lo, hi)                                                            \
  if (c->field < (lo) || c->field > (hi))                                                   \
    return ERR("%s: %s = %d is out of range [%d, %d]", name, key, c->field, (int)(lo),      \
               (int)(hi));
  /* KEY names the setting as config.json / GGUF metadata call it. */
  RANGE(vocab_size, "vocab_size", 1, CONFIG_MAX_VOCAB)
  RANGE(dim, "hidden_size (embedding_length)", 1, CONFIG_MAX_DIM)
  RANGE(n_layers, "num_hidden_layers (block_count)", 1, CONFIG_MAX_LAYERS)
  RANGE(n_heads, "num_attention_heads (attention.head_count)", 1, 4096)
  RANGE(n_kv_heads, "num_key_value_heads (attention.head_count_kv)", 1, c->n_heads)
  RANGE(head_dim, "head_dim (attention.key_length)", 2, 4096)
  RANGE(ffn_dim, "intermediate_size (feed_forward_length)", 1, 8 * CONFIG_MAX_DIM)
  RANGE(max_seq_len, "max_position_embeddings (context_length)", 1, 1 << 24)
#undef RANGE
  if (c->n_heads % c->n_kv_heads)
    return ERR("%s: %d attention heads are not a multiple of %d KV heads", name, c->n_heads,
               c->n_kv_heads);
  if (c->head_dim % 2)
    return ERR("%s: head_dim %d is odd (RoPE rotates pairs)", name, c->head_dim);
  if (!(c->rms_eps > 0 && c->rms_eps < 1))
    return ERR("%s: rms_norm_eps %g is not in (0, 1)", name, (double)c->rms_eps);
  if (!(c->rope_theta > 0 && isfinite(c->rope_theta)))
    return ERR("%s: rope_theta %g is not positive", name, (double)c->rope_theta);
  if (c->rope_scaling != ROPE_SCALING_NONE && !(c->rope_factor > 0 && isfinite(c->rope_factor)))
    return ERR("%s: rope scaling factor %g is not positive", name, (double)c->rope_factor);
  if (c->rope_dim < 2 || c->rope_dim > c->head_dim || c->rope_dim % 2)
    return ERR("%s: %d rotated dims per head of %d (partial_rotary_factor) must be even and "
               "within the head", name, c->rope_dim, c->head_dim);
  if (c->sliding_window < 0 || c->swa_first_layer < 0 || c->swa_pattern < 0)
    return ERR("%s: sliding_window %d / max_window_layers %d is negative", name,
               c->sliding_window, c->swa_first_layer);
  if (c->rope_scaling == ROPE_SCALING_LLAMA3 &&
      (!(c->rope_low_freq_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
       c->rope_orig_max_pos <= 0))
    return ERR("%s: llama3 rope_scaling needs low_freq_factor > 0, high_freq_factor > "
               "low_freq_factor and original_max_position_embeddings > 0", name);
  return 0;
}

/* ---- HF config.json ---- */

/* Reads integer KEY of O into *OUT. Absent or null: *OUT keeps its value unless REQUIRED. */
int cfg_json_int(const cJSON *o, const char *key, int *out, int required, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v || cJSON_IsNull(v))
    return required ? ERR("%s: missing \"%s\"", name, key) : 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < -1 ||
      v->valuedouble > 2147483647.0)
    return ERR("%s: \"%s\" is not an integer", name, key);
  *out = (int)v->valuedouble;
  return 0;
}

int cfg_json_float(const cJSON *o, const char *key, float *out, int required,
                      const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v || cJSON_IsNull(v))
    return required ? ERR("%s: missing \"%s\"", name, key) : 0;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return ERR("%s: \"%s\" is not a number", name, key);
  *out = (float)v->valuedouble;
  return 0;
}

int cfg_json_bool(const cJSON *o, const char *key, int *out, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsBool(v))
    return ERR("%s: \"%s\" is not true or false", name, key);
  *out = cJSON_IsTrue(v);
  return 0;
}

/* bos/eos_token_id: an integer, a list of integers (the first is taken) or null. */
static int json_token_id(const cJSON *o, const char *key, int *out, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (cJSON_IsArray(v))
    v = cJSON_GetArrayItem(v, 0);
  if (!v || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
      v->valuedouble > 2147483647.0)
    return ERR("%s: \"%s\" is not a token id", name, key);
  *out = (int)v->valuedouble;
  return 0;
}

/* KEY of RS: a list of N numbers into OUT. */
static int json_factors(const cJSON *rs, const char *key, float *out, int n, const char *obj,
                        const char *name) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(rs, key);
  if (!cJSON_IsArray(a))
    return ERR("%s: %s has no \"%s\" list", name, obj, key);
  if (cJSON_GetArraySize(a) != n)
    return ERR("%s: %s.%s has %d entries, expected rotated dims / 2 = %d", name, obj, key,
               cJSON_GetArraySize(a), n);
  int i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, a) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
      return ERR("%s: %s.%s[%d] is not a positive number", name, obj, key, i);
    out[i++] = (float)v->valuedouble;
  }
  return 0;
}

/* Phi-3's longrope (older spelling "su"), after transformers' _compute_longrope_parameters:
 * original_max_position_embeddings from the top level or the rope object (required); the
 * attention factor from "attention_factor" or else sqrt(1 + ln(s) / ln(original)) (1 when
 * s <= 1) with s the object's "factor" or else max_position_embeddings / original. Needs
 * max_seq_len and rope_dim known. */
static int hf_longrope(struct model_config *c, const cJSON *root, const cJSON *rs, const char *obj,
                       const char *name) {
  c->rope_scaling = ROPE_SCALING_LONGROPE;
  int half = c->rope_dim / 2;
  if (half < 1 || half > ROPE_MAX_FACTORS)
    return ERR("%s: longrope with %d rotated dims (at most %d are supported)", name, c->rope_dim,
               2 * ROPE_MAX_FACTORS);
  c->rope_orig_max_pos = 0;
  c->rope_attn_factor = 0;
  if (cfg_json_int(root, "original_max_position_embeddings", &c->rope_orig_max_pos, 0, name) ||
      cfg_json_int(rs, "original_max_position_embeddings", &c->rope_orig_max_pos, 0, name) ||
      cfg_json_float(rs, "attention_factor", &c->rope_attn_factor, 0, name) ||
      json_factors(rs, "short_factor", c->rope_short_factor, half, obj, name) ||
      json_factors(rs, "long_factor", c->rope_long_factor, half, obj, name))
    return -1;
  if (c->rope_orig_max_pos <= 0)
    return ERR("%s: longrope needs original_max_position_embeddings > 0", name);
  float factor = 0;
  if (cfg_json_float(rs, "factor", &factor, 0, name))
    return -1;
  if (c->rope_attn_factor == 0) {
    /* transformers 5: "factor" when given, else the ratio of the context lengths */
    double s = factor > 0 ? (double)factor : (double)c->max_seq_len / c->rope_orig_max_pos;
    c->rope_attn_factor =
        s <= 1.0 ? 1.0f : (float)sqrt(1.0 + log(s) / log((double)c->rope_orig_max_pos));
  }
  if (!(c->rope_attn_factor > 0))
    return ERR("%s: %s.attention_factor %g is not positive", name, obj, (double)c->rope_attn_factor);
  return 0;
}

/* RoPE settings: transformers < 5 writes top-level rope_theta and rope_scaling {rope_type|type,
 * factor, ...}; transformers >= 5 writes one rope_parameters object {rope_type, rope_theta,
 * factor, ...}. Either is accepted; rope_parameters wins when both are present. */
static int hf_rope_scaling(struct model_config *c, const cJSON *root, const char *name) {
  if (cfg_json_float(root, "rope_theta", &c->rope_theta, 0, name))
    return -1;
  const char *key = "rope_parameters";
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!rs || cJSON_IsNull(rs))
    rs = cJSON_GetObjectItemCaseSensitive(root, key = "rope_scaling");
  if (!rs || cJSON_IsNull(rs))
    return 0;
  if (!cJSON_IsObject(rs))
    return ERR("%s: \"%s\" is not an object", name, key);
  if (cfg_json_float(rs, "rope_theta", &c->rope_theta, 0, name))
    return -1;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
  if (!type)
    type = cJSON_GetObjectItemCaseSensitive(rs, "type"); /* the older spelling */
  if (!type && !strcmp(key, "rope_parameters"))
    return 0; /* only rope_theta */
  if (!cJSON_IsString(type))
    return ERR("%s: %s has no \"rope_type\"", name, key);
  const char *t = type->valuestring;
  if (!strcmp(t, "default"))
    return 0;
  if (!strcmp(t, "longrope") || !strcmp(t, "su"))
    return hf_longrope(c, root, rs, key, name);
  if (cfg_json_float(rs, "factor", &c->rope_factor, 1, name))
    return -1;
  if (!strcmp(t, "linear")) {
    c->rope_scaling = ROPE_SCALING_LINEAR;
    return 0;
  }
  if (!strcmp(t, "llama3")) {
    c->rope_scaling = ROPE_SCALING_LLAMA3;
    if (cfg_json_float(rs, "low_freq_factor", &c->rope_low_freq_factor, 1, name) ||
        cfg_json_float(rs, "high_freq_factor", &c->rope_high_freq_factor, 1, name) ||
        cfg_json_int(rs, "original_max_position_embeddings", &c->rope_orig_max_pos, 1, name))
      return -1;
    return 0;
  }
  return ERR("%s: %s type \"%.40s\" is not supported (default, linear, llama3 and longrope are)", name,
             key, t);
}

static int hf_dtype(struct model_config *c, const cJSON *root, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
  if (!v)
    v = cJSON_GetObjectItemCaseSensitive(root, "dtype"); /* transformers >= 4.56 */
  if (!v || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsString(v))
    return ERR("%s: \"torch_dtype\" is not a string", name);
  const char *s = v->valuestring;
  if (!strcmp(s, "float32"))
    c->weight_dtype = DTYPE_F32;
  else if (!strcmp(s, "float16"))
    c->weight_dtype = DTYPE_F16;
  else if (!strcmp(s, "bfloat16"))
    c->weight_dtype = DTYPE_BF16;
  else
    return ERR("%s: torch_dtype \"%.40s\" is not supported (float32, float16, bfloat16 are)",
               name, s);
  return 0;
}

/* partial_rotary_factor (top level or in the rope object): rope_dim = head_dim * factor. */
static int hf_rope_dim(struct model_config *c, const cJSON *root, const char *name) {
  float prf = 1.0f;
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
  if (cfg_json_float(root, "partial_rotary_factor", &prf, 0, name) ||
      (cJSON_IsObject(rp) && cfg_json_float(rp, "partial_rotary_factor", &prf, 0, name)))
    return -1;
  if (!(prf > 0 && prf <= 1))
    return ERR("%s: partial_rotary_factor %g is not in (0, 1]", name, (double)prf);
  c->rope_dim = (int)((float)c->head_dim * prf);
  if (c->rope_dim < 2 || c->rope_dim % 2)
    return ERR("%s: partial_rotary_factor %g gives %d rotated dims of %d (must be even, >= 2)",
               name, (double)prf, c->rope_dim, c->head_dim);
  return 0;
}

int cfg_sliding_window(struct model_config *c, const cJSON *root, const char *use_key,
                       const char *name) {
  int use = 1;
  if (use_key && cfg_json_bool(root, use_key, &use, name))
    return -1;
  c->sliding_window = 0;
  if (use && cfg_json_int(root, "sliding_window", &c->sliding_window, 0, name))
    return -1;
  if (c->sliding_window < 0)
    return ERR("%s: sliding_window %d is negative", name, c->sliding_window);
  return 0;
}

/* The fields every architecture shares; the architecture's hf_config reads the rest. */
static int hf_parse(struct model_config *c, const cJSON *root, const char *name) {
  if (!cJSON_IsObject(root))
    return ERR("%s: not a JSON object", name);
  const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
  const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
  if (!cJSON_IsString(a0))
    return ERR("%s: no \"architectures\" list naming the model class", name);
  const struct arch *arch = arch_by_hf_class(a0->valuestring);
  if (!arch)
    return ERR("%s: architecture %.64s is not supported (%s are)", name, a0->valuestring,
               arch_list(0));
  snprintf(c->arch, sizeof c->arch, "%s", arch->name);
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  /* Gemma 2 checks its own activation (gelu_pytorch_tanh) in its hf_config */
  if (act && arch != &arch_gemma2 && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
    return ERR("%s: hidden_act must be \"silu\"", name);
  int attention_bias = 0, mlp_bias = 0;
  if (cfg_json_bool(root, "attention_bias", &attention_bias, name) ||
      cfg_json_bool(root, "mlp_bias", &mlp_bias, name))
    return -1;
  if (attention_bias || mlp_bias)
    return ERR("%s: %s = true is not supported", name, attention_bias ? "attention_bias" : "mlp_bias");
  c->max_seq_len = arch->default_ctx;
  c->head_dim = 0;
  c->n_kv_heads = 0;
  if (cfg_json_int(root, "vocab_size", &c->vocab_size, 1, name) ||
      cfg_json_int(root, "hidden_size", &c->dim, 1, name) ||
      cfg_json_int(root, "intermediate_size", &c->ffn_dim, 1, name) ||
      cfg_json_int(root, "num_hidden_layers", &c->n_layers, 1, name) ||
      cfg_json_int(root, "num_attention_heads", &c->n_heads, 1, name) ||
      cfg_json_int(root, "num_key_value_heads", &c->n_kv_heads, 0, name) ||
      cfg_json_int(root, "head_dim", &c->head_dim, 0, name) ||
      cfg_json_int(root, "max_position_embeddings", &c->max_seq_len, 0, name) ||
      cfg_json_float(root, "rms_norm_eps", &c->rms_eps, 0, name) ||
      cfg_json_bool(root, "tie_word_embeddings", &c->tie_embeddings, name) ||
      json_token_id(root, "bos_token_id", &c->bos_id, name) ||
      json_token_id(root, "eos_token_id", &c->eos_id, name) || hf_dtype(c, root, name))
    return -1;
  if (c->n_heads <= 0)
    return ERR("%s: num_attention_heads %d is not positive", name, c->n_heads);
  if (c->n_kv_heads == 0)
    c->n_kv_heads = c->n_heads;
  if (c->head_dim == 0)
    c->head_dim = c->dim / c->n_heads;
  if (c->head_dim % 2)
    return ERR("%s: head_dim %d is odd (RoPE rotates pairs)", name, c->head_dim);
  if (hf_rope_dim(c, root, name) || hf_rope_scaling(c, root, name))
    return -1;
  if (arch->hf_config && arch->hf_config(c, root, name))
    return -1;
  c->rope_neox = 1; /* HF checkpoints use rotate_half (first half / second half pairs) */
  return config_validate(c, name);
}

int config_from_hf_json(struct model_config *c, const char *json, size_t len, const char *name) {
  config_defaults(c);
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root)
    return ERR("%s: not valid JSON", name);
  int rc = hf_parse(c, root, name);
  cJSON_Delete(root);
  return rc;
}

int config_from_hf_file(struct model_config *c, const char *path) {
  size_t len;
  char *text = file_read_all(path, &len);
  if (!text)
    return -1;
  int rc = config_from_hf_json(c, text, len, path);
  free(text);
  return rc;
}

/* ---- GGUF metadata ---- */

static int gguf_key(char *buf, size_t n, const char *arch, const char *suffix) {
  return snprintf(buf, n, "%s.%s", arch, suffix) < (int)n ? 0 : -1;
}

/* Integer ARCH.SUFFIX into *OUT; absent: keep *OUT unless REQUIRED. */
int cfg_gguf_int(const struct gguf_file *g, const char *arch, const char *suffix, int *out,
                        int required, const char *name) {
  char key[128];
  gguf_key(key, sizeof key, arch, suffix);
  const struct gguf_kv *kv = gguf_find(g, key);
  if (!kv)
    return required ? ERR("%s: missing metadata key %s", name, key) : 0;
  int64_t v;
  if (gguf_get_int(g, key, &v) != 0 || v < 0 || v > 2147483647)
    return ERR("%s: metadata key %s is not a non-negative integer", name, key);
  *out = (int)v;
  return 0;
}

int cfg_gguf_float(const struct gguf_file *g, const char *arch, const char *suffix,
                          float *out, int required, const char *name) {
  char key[128];
  gguf_key(key, sizeof key, arch, suffix);
  const struct gguf_kv *kv = gguf_find(g, key);
  if (!kv)
    return required ? ERR("%s: missing metadata key %s", name, key) : 0;
  double v;
  if (gguf_get_float(g, key, &v) != 0 || !isfinite(v))
    return ERR("%s: metadata key %s is not a number", name, key);
  *out = (float)v;
  return 0;
}

int config_from_gguf(struct model_config *c, const struct gguf_file *g, const char *name) {
  config_defaults(c);
  size_t alen;
  const char *arch = gguf_get_str(g, "general.architecture", &alen);
  if (!arch)
    return ERR("%s: no general.architecture", name);
  const struct arch *ar = arch_by_gguf(arch, alen);
  int64_t num_experts = 0; /* GGUF "llama" with experts is Mixtral (llama.cpp's converter writes it so) */
  if (ar == &arch_llama && gguf_get_int(g, "llama.expert_count", &num_experts) == 0 && num_experts > 0)
    ar = &arch_mixtral;
  if (!ar)
    return ERR("%s: architecture \"%.*s\" is not supported (%s are)", name,
               (int)(alen > 64 ? 64 : alen), arch, arch_list(1));
  c->rope_neox = ar->rope_neox_gguf;
  snprintf(c->arch, sizeof c->arch, "%s", ar->name);
  /* the metadata keys' prefix (Mixtral's are llama.*) */
  const char *a = ar == &arch_mixtral ? "llama" : ar->gguf_name;
  int rope_dims = 0, value_len = 0;
  c->max_seq_len = 2048;
  if (cfg_gguf_int(g, a, "context_length", &c->max_seq_len, 0, name) ||
      cfg_gguf_int(g, a, "embedding_length", &c->dim, 1, name) ||
      cfg_gguf_int(g, a, "block_count", &c->n_layers, 1, name) ||
      cfg_gguf_int(g, a, "feed_forward_length", &c->ffn_dim, 1, name) ||
      cfg_gguf_int(g, a, "attention.head_count", &c->n_heads, 1, name) ||
      cfg_gguf_int(g, a, "attention.head_count_kv", &c->n_kv_heads, 0, name) ||
      cfg_gguf_int(g, a, "attention.key_length", &c->head_dim, 0, name) ||
      cfg_gguf_int(g, a, "attention.value_length", &value_len, 0, name) ||
      cfg_gguf_int(g, a, "rope.dimension_count", &rope_dims, 0, name) ||
      cfg_gguf_float(g, a, "attention.layer_norm_rms_epsilon", &c->rms_eps, 0, name) ||
      cfg_gguf_float(g, a, "rope.freq_base", &c->rope_theta, 0, name))
    return -1;
  if (c->n_heads <= 0)
    return ERR("%s: %s.attention.head_count is 0", name, a);
  if (c->n_kv_heads == 0)
    c->n_kv_heads = c->n_heads;
  if (c->head_dim == 0)
    c->head_dim = c->dim / c->n_heads;
  if (value_len && value_len != c->head_dim)
    return ERR("%s: %s.attention.value_length %d differs from key_length %d (unsupported)", name,
               a, value_len, c->head_dim);
  if (rope_dims && rope_dims != c->head_dim && !ar->gguf_partial_rope)
    return ERR("%s: %s.rope.dimension_count %d differs from head_dim %d (partial RoPE is "
               "unsupported)", name, a, rope_dims, c->head_dim);
  /* Linear RoPE scaling is stored as metadata; llama3-style scaling as the rope_freqs tensor. */
  char key[128];
  gguf_key(key, sizeof key, a, "rope.scaling.type");
  size_t slen;
  const char *st = gguf_get_str(g, key, &slen);
  if (st && slen == 6 && !memcmp(st, "linear", 6)) {
    c->rope_scaling = ROPE_SCALING_LINEAR;
    if (cfg_gguf_float(g, a, "rope.scaling.factor", &c->rope_factor, 1, name))
      return -1;
  } else if (st && !(slen == 4 && !memcmp(st, "none", 4))) {
    return ERR("%s: %s = \"%.*s\" is not supported (none and linear are)", name, key,
               (int)(slen > 32 ? 32 : slen), st);
  }
  const struct gguf_kv *tokens = gguf_find(g, "tokenizer.ggml.tokens");
  const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
  if (tokens && tokens->type == GGUF_TYPE_ARRAY && tokens->len <= CONFIG_MAX_VOCAB)
    c->vocab_size = (int)tokens->len;
  else if (emb && emb->num_dims == 2 && emb->ne[1] <= CONFIG_MAX_VOCAB)
    c->vocab_size = (int)emb->ne[1];
  else
    return ERR("%s: no vocabulary size (neither tokenizer.ggml.tokens nor token_embd.weight)",
               name);
  int64_t id;
  if (gguf_get_int(g, "tokenizer.ggml.bos_token_id", &id) == 0 && id >= 0 && id < c->vocab_size)
    c->bos_id = (int)id;
  if (gguf_get_int(g, "tokenizer.ggml.eos_token_id", &id) == 0 && id >= 0 && id < c->vocab_size)
    c->eos_id = (int)id;
  c->tie_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
  c->rope_dim = rope_dims ? rope_dims : c->head_dim;
  if (ar->gguf_config && ar->gguf_config(c, g, name))
    return -1;
  return config_validate(c, name);
}
