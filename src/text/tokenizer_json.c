/* tokenizer_json.c - loads HF tokenizer.json (+ tokenizer_config.json and
 * generation_config.json from the same directory) into the tokenizer description. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "util/file.h"
#include "util/log.h"

static const char *jstr(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Boolean member: DEF when absent or null. */
static int jbool(const cJSON *o, const char *key, int def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (cJSON_IsBool(v))
    return cJSON_IsTrue(v);
  return def;
}

static char *dup_len(const char *s, size_t *len) {
  size_t n = strlen(s);
  char *d = malloc(n + 1);
  if (d)
    memcpy(d, s, n + 1);
  if (len)
    *len = n;
  return d;
}

/* Reads {"String": s} or {"Regex": r} into a literal or a compiled regex. */
static int read_pattern(const cJSON *pat, char **lit, size_t *lit_len, struct regex **re) {
  *lit = NULL;
  *re = NULL;
  const char *s = jstr(pat, "String");
  if (s) {
    *lit = dup_len(s, lit_len);
    return *lit ? 0 : ERR("out of memory");
  }
  const char *r = jstr(pat, "Regex");
  if (r) {
    *re = regex_compile(r, strlen(r));
    return *re ? 0 : -1;
  }
  return ERR("tokenizer.json: pattern is neither String nor Regex");
}

static int load_normalizer(struct tokenizer *t, const cJSON *n) {
  if (!n || cJSON_IsNull(n))
    return 0;
  const char *type = jstr(n, "type");
  if (!type)
    return ERR("tokenizer.json: normalizer without a type");
  if (!strcmp(type, "Sequence")) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
      if (load_normalizer(t, it))
        return -1;
    }
    return 0;
  }
  struct normalize_step st = {0};
  if (!strcmp(type, "NFC"))
    st.kind = NORMALIZE_NFC;
  else if (!strcmp(type, "NFD"))
    st.kind = NORMALIZE_NFD;
  else if (!strcmp(type, "NFKC"))
    st.kind = NORMALIZE_NFKC;
  else if (!strcmp(type, "NFKD"))
    st.kind = NORMALIZE_NFKD;
  else if (!strcmp(type, "Lowercase"))
    st.kind = NORMALIZE_LOWERCASE;
  else if (!strcmp(type, "StripAccents"))
    st.kind = NORMALIZE_STRIP_ACCENTS;
  else if (!strcmp(type, "Strip")) {
    st.kind = NORMALIZE_STRIP;
    st.left = jbool(n, "strip_left", 1);
    st.right = jbool(n, "strip_right", 1);
  } else if (!strcmp(type, "Prepend")) {
    st.kind = NORMALIZE_PREPEND;
    const char *p = jstr(n, "prepend");
    if (!p)
      return ERR("tokenizer.json: Prepend normalizer without prepend");
    if (!(st.a = dup_len(p, &st.a_len)))
      return ERR("out of memory");
  } else if (!strcmp(type, "Replace")) {
    st.kind = NORMALIZE_REPLACE;
    const char *c = jstr(n, "content");
    if (!c)
      return ERR("tokenizer.json: Replace normalizer without content");
    if (read_pattern(cJSON_GetObjectItemCaseSensitive(n, "pattern"), &st.a, &st.a_len, &st.re))
      return -1;
    if (!(st.b = dup_len(c, &st.b_len))) {
      free(st.a);
      regex_free(st.re);
      return ERR("out of memory");
    }
  } else if (!strcmp(type, "Precompiled")) {
    /* SentencePiece's precompiled charsmap (NFKC-like rules). The LLM vocabularies pagoda
     * targets ship an identity map here; the rules are not interpreted. */
    log_warn("tokenizer.json: Precompiled normalizer treated as identity");
    return 0;
  } else {
    return ERR("tokenizer.json: unsupported normalizer type '%s'", type);
  }
  if (normalizer_add(&t->norm, st)) {
    free(st.a);
    free(st.b);
    regex_free(st.re);
    return -1;
  }
  return 0;
}

static int parse_behavior(const char *b, enum split_behavior *out) {
  if (!b || !strcmp(b, "Isolated"))
    *out = SPLIT_ISOLATED;
  else if (!strcmp(b, "Removed"))
    *out = SPLIT_REMOVED;
  else if (!strcmp(b, "MergedWithPrevious"))
    *out = SPLIT_MERGED_WITH_PREVIOUS;
  else if (!strcmp(b, "MergedWithNext"))
    *out = SPLIT_MERGED_WITH_NEXT;
  else if (!strcmp(b, "Contiguous"))
    *out = SPLIT_CONTIGUOUS;
  else
    return ERR("tokenizer.json: unknown split behavior '%s'", b);
  return 0;
}

/* Metaspace's prepend rule: prepend_scheme (new) or add_prefix_space (old, bool). */
static enum prepend_scheme read_prepend_scheme(const cJSON *o) {
  const char *s = jstr(o, "prepend_scheme");
  if (s)
    return !strcmp(s, "first") ? PREPEND_FIRST : !strcmp(s, "never") ? PREPEND_NEVER : PREPEND_ALWAYS;
  return jbool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
}

static int read_replacement(const cJSON *o, char *repl, int *repl_len) {
  const char *r = jstr(o, "replacement");
  if (!r)
    r = "\xe2\x96\x81";
  size_t n = strlen(r);
  if (n == 0 || n > 4)
    return ERR("tokenizer.json: Metaspace replacement must be one character");
  memcpy(repl, r, n);
  repl[n] = 0;
  *repl_len = (int)n;
  return 0;
}

static int load_pretokenizer(struct tokenizer *t, const cJSON *p) {
  if (!p || cJSON_IsNull(p))
    return 0;
  const char *type = jstr(p, "type");
  if (!type)
    return ERR("tokenizer.json: pre_tokenizer without a type");
  if (!strcmp(type, "Sequence")) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) {
      if (load_pretokenizer(t, it))
        return -1;
    }
    return 0;
  }
  struct pretokenize_step st = {0};
  st.behavior = SPLIT_ISOLATED;
  if (!strcmp(type, "Split")) {
    st.kind = PRETOKENIZE_SPLIT;
    if (parse_behavior(jstr(p, "behavior"), &st.behavior))
      return -1;
    st.invert = jbool(p, "invert", 0);
    if (read_pattern(cJSON_GetObjectItemCaseSensitive(p, "pattern"), &st.lit, &st.lit_len, &st.re))
      return -1;
  } else if (!strcmp(type, "ByteLevel")) {
    st.kind = PRETOKENIZE_BYTE_LEVEL;
    st.add_prefix_space = jbool(p, "add_prefix_space", 1);
    if (jbool(p, "use_regex", 1)) {
      st.re = regex_compile(pretokenize_gpt2_pattern, strlen(pretokenize_gpt2_pattern));
      if (!st.re)
        return -1;
    }
    t->byte_level = 1;
  } else if (!strcmp(type, "Digits")) {
    st.kind = PRETOKENIZE_DIGITS;
    st.individual = jbool(p, "individual_digits", 0);
  } else if (!strcmp(type, "Punctuation")) {
    st.kind = PRETOKENIZE_PUNCTUATION;
    if (parse_behavior(jstr(p, "behavior"), &st.behavior))
      return -1;
  } else if (!strcmp(type, "Metaspace")) {
    st.kind = PRETOKENIZE_METASPACE;
    if (read_replacement(p, st.repl, &st.repl_len))
      return -1;
    st.prepend = read_prepend_scheme(p);
    st.split = jbool(p, "split", 1);
  } else if (!strcmp(type, "Whitespace")) {
    st.kind = PRETOKENIZE_WHITESPACE;
    /* \w+|[^\w\s]+ with Oniguruma's \w (Alphabetic, marks, decimal digits, connectors,
     * joiners), which unlike PCRE2's \w leaves out other numbers such as superscripts. */
    static const char pat[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
                              "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\s]+";
    st.re = regex_compile(pat, sizeof pat - 1);
    if (!st.re)
      return -1;
    st.invert = 1; /* the matches are the words kept; the rest is removed */
  } else if (!strcmp(type, "WhitespaceSplit")) {
    st.kind = PRETOKENIZE_WHITESPACE_SPLIT;
  } else {
    return ERR("tokenizer.json: unsupported pre_tokenizer type '%s'", type);
  }
  if (pretokenizer_add(&t->pre, st)) {
    regex_free(st.re);
    free(st.lit);
    return -1;
  }
  return 0;
}

static int load_decoder(struct tokenizer *t, const cJSON *d) {
  if (!d || cJSON_IsNull(d))
    return 0;
  const char *type = jstr(d, "type");
  if (!type)
    return ERR("tokenizer.json: decoder without a type");
  if (!strcmp(type, "Sequence")) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(d, "decoders")) {
      if (load_decoder(t, it))
        return -1;
    }
    return 0;
  }
  struct decode_step st = {0};
  if (!strcmp(type, "ByteLevel")) {
    st.kind = DECODE_BYTE_LEVEL;
  } else if (!strcmp(type, "ByteFallback")) {
    st.kind = DECODE_BYTE_FALLBACK;
  } else if (!strcmp(type, "Fuse")) {
    return 0; /* the stream is already one string */
  } else if (!strcmp(type, "Strip")) {
    st.kind = DECODE_STRIP;
    const char *c = jstr(d, "content");
    const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start");
    if (!c || strlen(c) != 1) {
      log_warn("tokenizer.json: Strip decoder with a non-ASCII content ignored");
      return 0;
    }
    st.ch = c[0];
    st.count = cJSON_IsNumber(start) ? start->valueint : 0;
  } else if (!strcmp(type, "Replace")) {
    st.kind = DECODE_REPLACE;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(d, "pattern");
    const char *from = jstr(pat, "String"), *to = jstr(d, "content");
    if (!from || !to)
      return ERR("tokenizer.json: Replace decoder needs a String pattern and content");
    st.a = dup_len(from, &st.a_len);
    st.b = dup_len(to, &st.b_len);
    if (!st.a || !st.b) {
      free(st.a);
      free(st.b);
      return ERR("out of memory");
    }
  } else if (!strcmp(type, "Metaspace")) {
    st.kind = DECODE_METASPACE;
    char repl[8];
    int rl;
    if (read_replacement(d, repl, &rl))
      return -1;
    st.a = dup_len(repl, &st.a_len);
    if (!st.a)
      return ERR("out of memory");
    st.strip_first = read_prepend_scheme(d) != PREPEND_NEVER;
  } else {
    return ERR("tokenizer.json: unsupported decoder type '%s'", type);
  }
  return tokenizer_add_decode(t, st);
}

/* BOS/EOS from a post_processor: the special tokens before / after sequence A. */
static void load_post_processor(struct tokenizer *t, const cJSON *pp, int *found_bos, int *found_eos) {
  if (!pp || cJSON_IsNull(pp))
    return;
  const char *type = jstr(pp, "type");
  if (!type)
    return;
  if (!strcmp(type, "Sequence")) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pp, "processors")) load_post_processor(t, it, found_bos, found_eos);
    return;
  }
  if (!strcmp(type, "TemplateProcessing")) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
    int seen_a = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
      if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
        seen_a = 1;
        continue;
      }
      const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
      const char *name = jstr(sp, "id");
      if (!name)
        continue;
      int32_t id = -1;
      const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name);
      const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
      if (cJSON_IsArray(ids) && cJSON_GetArraySize(ids) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(ids, 0)))
        id = cJSON_GetArrayItem(ids, 0)->valueint;
      else
        id = vocab_find(&t->vocab, name, strlen(name));
      if (id < 0 || id >= t->vocab.n)
        continue;
      if (!seen_a) {
        t->bos_id = id;
        *found_bos = 1;
      } else {
        t->eos_id = id;
        *found_eos = 1;
      }
    }
    return;
  }
  if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(pp, "cls");
    const cJSON *sep = cJSON_GetObjectItemCaseSensitive(pp, "sep");
    if (cJSON_GetArraySize(cls) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(cls, 1))) {
      t->bos_id = cJSON_GetArrayItem(cls, 1)->valueint;
      *found_bos = 1;
    }
    if (cJSON_GetArraySize(sep) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(sep, 1))) {
      t->eos_id = cJSON_GetArrayItem(sep, 1)->valueint;
      *found_eos = 1;
    }
  }
}

/* A token named in tokenizer_config.json: "text" or {"content": "text"}. */
static int32_t config_token(const struct tokenizer *t, const cJSON *cfg, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  const char *s = cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
  return s ? vocab_find(&t->vocab, s, strlen(s)) : -1;
}

static cJSON *read_json(const char *path, int required) {
  size_t len;
  char *txt = file_read_all(path, &len);
  if (!txt) {
    if (required)
      ERR("%s: cannot read", path);
    else
      err_clear();
    return NULL;
  }
  cJSON *j = cJSON_ParseWithLength(txt, len);
  free(txt);
  if (!j) {
    if (required)
      ERR("%s: malformed JSON", path);
    else
      log_warn("%s: malformed JSON, ignored", path);
  }
  return j;
}

static int load_config(struct tokenizer *t, const char *dir, int found_bos, int found_eos) {
  size_t n = strlen(dir) + 32;
  char *path = malloc(n);
  if (!path)
    return ERR("out of memory");
  snprintf(path, n, "%s/tokenizer_config.json", dir);
  cJSON *cfg = file_exists(path) ? read_json(path, 0) : NULL;
  if (cfg) {
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
    if (cJSON_IsArray(ct)) {
      const cJSON *it;
      cJSON_ArrayForEach(it, ct) {
        const char *name = jstr(it, "name");
        if (name && !strcmp(name, "default"))
          tmpl = jstr(it, "template");
      }
    }
    if (tmpl && !(t->chat_template = strdup(tmpl))) {
      cJSON_Delete(cfg);
      free(path);
      return ERR("out of memory");
    }
    int32_t bos = config_token(t, cfg, "bos_token"), eos = config_token(t, cfg, "eos_token");
    if (bos >= 0)
      t->bos_id = bos;
    if (eos >= 0)
      t->eos_id = eos;
    /* LlamaTokenizerFast and friends rebuild the post-processor from these flags. */
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    t->add_bos = cJSON_IsBool(ab) ? cJSON_IsTrue(ab) : found_bos;
    t->add_eos = cJSON_IsBool(ae) ? cJSON_IsTrue(ae) : found_eos;
    cJSON_Delete(cfg);
  } else {
    t->add_bos = found_bos;
    t->add_eos = found_eos;
  }
  /* Newer checkpoints keep the template beside the config: chat_template.jinja, or
   * chat_template.json {"chat_template": "..."}. */
  if (!t->chat_template) {
    snprintf(path, n, "%s/chat_template.jinja", dir);
    if (file_exists(path)) {
      t->chat_template = file_read_all(path, NULL);
      if (!t->chat_template)
        err_clear();
    }
  }
  if (!t->chat_template) {
    snprintf(path, n, "%s/chat_template.json", dir);
    cJSON *ct = file_exists(path) ? read_json(path, 0) : NULL;
    const char *s = ct ? jstr(ct, "chat_template") : NULL;
    if (s && !(t->chat_template = strdup(s))) {
      cJSON_Delete(ct);
      free(path);
      return ERR("out of memory");
    }
    cJSON_Delete(ct);
  }
  free(path);
  return 0;
}

/* generation_config.json's eos_token_id (a number or a list) adds end-of-generation ids. */
static void load_generation_config(struct tokenizer *t, const char *dir) {
  size_t n = strlen(dir) + 32;
  char *path = malloc(n);
  if (!path)
    return;
  snprintf(path, n, "%s/generation_config.json", dir);
  cJSON *g = file_exists(path) ? read_json(path, 0) : NULL;
  free(path);
  if (!g)
    return;
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(g, "eos_token_id");
  if (cJSON_IsNumber(e) && e->valueint >= 0 && e->valueint < t->vocab.n)
    t->eog[e->valueint] = 1;
  const cJSON *it;
  if (cJSON_IsArray(e))
    cJSON_ArrayForEach(it, e) if (cJSON_IsNumber(it) && it->valueint >= 0 && it->valueint < t->vocab.n)
        t->eog[it->valueint] = 1;
  cJSON_Delete(g);
}

static int load_merges(struct tokenizer *t, const cJSON *merges) {
  int n = cJSON_GetArraySize(merges);
  if (bpe_merges_init(&t->merges, n))
    return -1;
  char *buf = NULL;
  size_t cap = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, merges) {
    const char *a, *b;
    size_t la, lb;
    if (cJSON_IsString(it)) {
      /* "left right": tokens contain no space in this older form. */
      const char *s = it->valuestring;
      const char *sp = strchr(s, ' ');
      if (!sp) {
        free(buf);
        return ERR("tokenizer.json: malformed merge '%s'", s);
      }
      a = s;
      la = (size_t)(sp - s);
      b = sp + 1;
      lb = strlen(b);
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
      a = cJSON_GetArrayItem(it, 0)->valuestring;
      b = cJSON_GetArrayItem(it, 1)->valuestring;
      la = strlen(a);
      lb = strlen(b);
    } else {
      free(buf);
      return ERR("tokenizer.json: malformed merge entry");
    }
    if (la + lb > cap) {
      cap = (la + lb) * 2 + 16;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        return ERR("out of memory");
      }
      buf = nb;
    }
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    int32_t ia = vocab_find(&t->vocab, a, la), ib = vocab_find(&t->vocab, b, lb);
    int32_t im = vocab_find(&t->vocab, buf, la + lb);
    if (ia < 0 || ib < 0 || im < 0) {
      /* HF refuses such a file; keep the rank slot so later ranks stay aligned. */
      t->merges.n++;
      continue;
    }
    if (bpe_merges_add(&t->merges, ia, ib, im)) {
      free(buf);
      return -1;
    }
  }
  free(buf);
  return 0;
}

int tokenizer_load_json(struct tokenizer *t, const char *json_path, const char *dir) {
  cJSON *j = read_json(json_path, 1);
  if (!j)
    return -1;
  int rc = -1;
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
  const char *mtype = jstr(model, "type");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
  if (!cJSON_IsObject(model) || !cJSON_IsObject(vocab)) {
    ERR("%s: no model.vocab object (not a tokenizer.json?)", json_path);
    goto out;
  }
  if (mtype ? strcmp(mtype, "BPE") != 0 : !cJSON_IsArray(merges)) {
    ERR("%s: model type '%s' is not supported (BPE only)", json_path, mtype ? mtype : "?");
    goto out;
  }
  if (!cJSON_IsArray(merges)) {
    ERR("%s: BPE model without merges", json_path);
    goto out;
  }
  int max_id = -1;
  const cJSON *it;
  cJSON_ArrayForEach(it, vocab) {
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (1 << 26)) {
      ERR("%s: bad id for token '%s'", json_path, it->string ? it->string : "?");
      goto out;
    }
    if (it->valueint > max_id)
      max_id = it->valueint;
  }
  cJSON_ArrayForEach(it, added) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 26) || !jstr(it, "content")) {
      ERR("%s: malformed added_tokens entry", json_path);
      goto out;
    }
    if (id->valueint > max_id)
      max_id = id->valueint;
  }
  if (vocab_init(&t->vocab, max_id + 1))
    goto out;
  cJSON_ArrayForEach(it, vocab) {
    if (vocab_text(&t->vocab, it->valueint, NULL))
      continue; /* two texts for one id: keep the first */
    if (vocab_set(&t->vocab, it->valueint, it->string, strlen(it->string)))
      goto out;
    t->vocab.type[it->valueint] = VOCAB_TYPE_NORMAL;
  }
  const cJSON *norm_j = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
  int t_has_normalizer = norm_j && !cJSON_IsNull(norm_j);
  cJSON_ArrayForEach(it, added) {
    int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
    const char *c = jstr(it, "content");
    int special = jbool(it, "special", 0);
    /* A token normalized like the text only differs from raw matching when there is a
     * normalizer (HF's default for `normalized` is !special); HF then also spells a new
     * token by its normalized content (set in tokenizer_finish). */
    int normalized = t_has_normalizer && jbool(it, "normalized", !special);
    if (!vocab_text(&t->vocab, id, NULL)) {
      if (!t->added_only && !(t->added_only = calloc((size_t)t->vocab.n, 1))) {
        ERR("out of memory");
        goto out;
      }
      t->added_only[id] = 1;
      if (!normalized && vocab_set(&t->vocab, id, c, strlen(c)))
        goto out;
    }
    t->vocab.type[id] = special ? VOCAB_TYPE_CONTROL : VOCAB_TYPE_USER_DEFINED;
    if (tokenizer_add_added(t, id, c, strlen(c), special, jbool(it, "lstrip", 0), jbool(it, "rstrip", 0),
                            jbool(it, "single_word", 0), normalized))
      goto out;
  }
  t->model = TOKENIZER_MODEL_BPE;
  t->byte_fallback = jbool(model, "byte_fallback", 0);
  t->fuse_unk = jbool(model, "fuse_unk", 0);
  t->ignore_merges = jbool(model, "ignore_merges", 0);
  const char *unk = jstr(model, "unk_token");
  t->unk_id = unk ? vocab_find(&t->vocab, unk, strlen(unk)) : -1;
  const char *cs = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
  if ((cs && *cs) || (ew && *ew)) {
    ERR("%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported", json_path);
    goto out;
  }
  if (load_merges(t, merges) || load_normalizer(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer")) ||
      load_pretokenizer(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer")) ||
      load_decoder(t, cJSON_GetObjectItemCaseSensitive(j, "decoder")))
    goto out;
  int found_bos = 0, found_eos = 0;
  load_post_processor(t, cJSON_GetObjectItemCaseSensitive(j, "post_processor"), &found_bos, &found_eos);
  if (load_config(t, dir, found_bos, found_eos))
    goto out;
  t->special = calloc((size_t)t->vocab.n, 1);
  t->eog = calloc((size_t)t->vocab.n, 1);
  if (!t->special || !t->eog) {
    ERR("out of memory");
    goto out;
  }
  load_generation_config(t, dir);
  rc = 0;
out:
  cJSON_Delete(j);
  return rc;
}
