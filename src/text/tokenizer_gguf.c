/* tokenizer_gguf.c - loads tokenizer.ggml.* metadata: "llama" (SentencePiece BPE by score,
 * byte fallback, space prefix) and "gpt2" (byte-level BPE by merge rank, with the
 * pre-tokenizer regexes llama.cpp uses for each tokenizer.ggml.pre name). */
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "text/tokenizer_impl.h"
#include "util/log.h"

/* Regexes applied in turn, each splitting the pieces of the previous one (matches and the
 * gaps between them are both kept), as llama.cpp does for each tokenizer.ggml.pre. */
#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define LLAMA3_RE                                                                                      \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| " \
  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE                                                                                   \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| " \
  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define CJK_RE "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

struct pre_entry {
  const char *names; /* NUL-separated aliases, ending with an empty string */
  const char *regexes[6];
  int ignore_merges, add_bos;
  int nfc; /* the HF tokenizer.json behind this name normalizes to NFC (Qwen2) */
};

static const struct pre_entry pre_table[] = {
    {"llama3\0llama-v3\0llama-bpe\0falcon3\0falcon-h1\0pixtral\0midm-2.0\0lfm2\0dbrx\0smaug-bpe\0",
     {LLAMA3_RE}, 1, 1, 0},
    {"deepseek-llm\0",
     {"[\\r\\n]",
      "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
      "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
      "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
      "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
      "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
      "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
      "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
      "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
      "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
      "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
      "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
      "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
      "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
      "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
      "\\x{1E900}-\\x{1E943}]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", CJK_RE, "\\p{N}+"},
     0, 0, 0},
    {"deepseek-coder\0", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_RE, "\\p{N}"}, 0, 0, 0},
    {"deepseek-v3\0",
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0, 0, 0},
    {"falcon\0", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_RE, "[0-9][0-9][0-9]"}, 0, 0, 0},
    {"starcoder\0refact\0command-r\0smollm\0codeshell\0exaone\0minerva-7b\0", {"\\p{N}", GPT2_RE}, 0, 0, 0},
    {"gpt-2\0phi-2\0mpt\0olmo\0jais\0jina-es\0jina-de\0gigachat\0jina-v2-es\0jina-v2-de\0roberta-bpe\0"
     "jina-v1-en\0jina-v2-code\0exaone4\0trillion\0mellum\0",
     {GPT2_RE}, 0, 0, 0},
    {"qwen2\0qwen2.5\0qwen-2.5\0deepseek-r1-qwen\0megrez\0hunyuan\0kormo\0", {QWEN2_RE}, 0, 0, 1},
    {"stablelm2\0", {QWEN2_RE}, 0, 0, 0},
    {"poro-chat\0bloom\0gpt3-finnish\0", {" ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81"
                                           "\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+"}, 0, 0, 0},
    {"chatglm-bpe\0glm4\0", {LLAMA3_RE}, 0, 0, 0},
    {"viking\0", {" ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+",
                  "\\p{N}"}, 0, 0, 0},
    {"tekken\0",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}"
      "\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     1, 1, 0},
    {"gpt-4o\0llama4\0",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|"
      "'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|"
      "'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0, 0, 0},
    {"seed-coder\0",
     {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| "
      "?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0, 0, 0},
};

/* llama.cpp's fallback for an unknown or missing name. */
static const struct pre_entry pre_default = {
    "default\0", {"[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]"}, 0, 0, 0};

static const struct pre_entry *find_pre(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++)
    for (const char *n = pre_table[i].names; *n; n += strlen(n) + 1)
      if (strlen(n) == len && !memcmp(n, name, len))
        return &pre_table[i];
  return NULL;
}

static int get_bool(const struct gguf_file *g, const char *key, int def) {
  int64_t v;
  return gguf_get_int(g, key, &v) == 0 ? v != 0 : def;
}

static int32_t get_id(const struct gguf_file *g, const char *key, int32_t def, int n) {
  int64_t v;
  if (gguf_get_int(g, key, &v) != 0)
    return def;
  return v >= 0 && v < n ? (int32_t)v : def;
}

static int load_merges(struct tokenizer *t, const struct gguf_file *g, const char *path) {
  const struct gguf_kv *kv = gguf_find(g, "tokenizer.ggml.merges");
  if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->elem_type != GGUF_TYPE_STRING)
    return ERR("%s: gpt2 tokenizer without tokenizer.ggml.merges", path);
  if (kv->len > (1u << 25))
    return ERR("%s: too many merges", path);
  if (bpe_merges_init(&t->merges, (int)kv->len))
    return -1;
  char *buf = NULL;
  size_t cap = 0;
  int rc = 0;
  for (uint64_t i = 0; i < kv->len; i++) {
    size_t len;
    const char *s = gguf_arr_str(g, kv, i, &len);
    /* "left right", split at the first space after the first byte (a token may be " "). */
    const char *sp = s && len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp) {
      t->merges.n++;
      continue;
    }
    size_t la = (size_t)(sp - s), lb = len - la - 1;
    if (la + lb > cap) {
      cap = (la + lb) * 2 + 16;
      char *nb = realloc(buf, cap);
      if (!nb) {
        rc = ERR("out of memory");
        break;
      }
      buf = nb;
    }
    memcpy(buf, s, la);
    memcpy(buf + la, sp + 1, lb);
    int32_t a = vocab_find(&t->vocab, s, la), b = vocab_find(&t->vocab, sp + 1, lb);
    int32_t m = vocab_find(&t->vocab, buf, la + lb);
    if (a < 0 || b < 0 || m < 0) {
      t->merges.n++;
      continue;
    }
    if ((rc = bpe_merges_add(&t->merges, a, b, m)))
      break;
  }
  free(buf);
  return rc;
}

static int add_regex_step(struct tokenizer *t, const char *re) {
  struct pretokenize_step st = {0};
  st.kind = PRETOKENIZE_SPLIT;
  st.behavior = SPLIT_ISOLATED;
  st.re = regex_compile(re, strlen(re));
  if (!st.re)
    return -1;
  if (pretokenizer_add(&t->pre, st)) {
    regex_free(st.re);
    return -1;
  }
  return 0;
}

static char *dup_str(const char *s) {
  char *d = strdup(s);
  if (!d)
    ERR("out of memory");
  return d;
}

int tokenizer_load_gguf(struct tokenizer *t, const char *path) {
  struct gguf_file *g = gguf_open(path);
  if (!g)
    return -1;
  int rc = -1;
  size_t mlen = 0, plen = 0;
  const char *model = gguf_get_str(g, "tokenizer.ggml.model", &mlen);
  const char *pre = gguf_get_str(g, "tokenizer.ggml.pre", &plen);
  const struct gguf_kv *tokens = gguf_find(g, "tokenizer.ggml.tokens");
  if (!model) {
    ERR("%s: no tokenizer.ggml.model (no vocabulary in this GGUF)", path);
    goto out;
  }
  if (!tokens || tokens->type != GGUF_TYPE_ARRAY || tokens->elem_type != GGUF_TYPE_STRING || !tokens->len) {
    ERR("%s: no tokenizer.ggml.tokens", path);
    goto out;
  }
  int is_spm = mlen == 5 && !memcmp(model, "llama", 5);
  int is_bpe = mlen == 4 && !memcmp(model, "gpt2", 4);
  if (!is_spm && !is_bpe) {
    ERR("%s: tokenizer model '%.*s' is not supported (llama or gpt2)", path, (int)mlen, model);
    goto out;
  }
  if (tokens->len > (1u << 26)) {
    ERR("%s: vocabulary too large", path);
    goto out;
  }
  int n = (int)tokens->len;
  if (vocab_init(&t->vocab, n))
    goto out;
  const struct gguf_kv *scores = gguf_find(g, "tokenizer.ggml.scores");
  const struct gguf_kv *types = gguf_find(g, "tokenizer.ggml.token_type");
  t->special = calloc((size_t)n, 1);
  t->eog = calloc((size_t)n, 1);
  if (!t->special || !t->eog) {
    ERR("out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    size_t len;
    const char *s = gguf_arr_str(g, tokens, (uint64_t)i, &len);
    if (!s) {
      ERR("%s: unreadable token %d", path, i);
      goto out;
    }
    if (vocab_set(&t->vocab, i, s, len))
      goto out;
    double sc;
    if (scores && gguf_arr_float(scores, (uint64_t)i, &sc) == 0)
      t->vocab.score[i] = (float)sc;
    int64_t ty = VOCAB_TYPE_NORMAL;
    if (types && gguf_arr_int(types, (uint64_t)i, &ty) != 0)
      ty = VOCAB_TYPE_NORMAL;
    if (ty < 0 || ty > VOCAB_TYPE_BYTE)
      ty = VOCAB_TYPE_UNDEFINED;
    t->vocab.type[i] = (uint8_t)ty;
    /* Control and unknown tokens are special (parse_special only); user-defined ones are
     * always matched in the text, as llama.cpp and HF's non-special added tokens are. */
    if (ty == VOCAB_TYPE_CONTROL || ty == VOCAB_TYPE_UNKNOWN || ty == VOCAB_TYPE_USER_DEFINED) {
      if (tokenizer_add_added(t, i, s, len, ty != VOCAB_TYPE_USER_DEFINED, 0, 0, 0, 0))
        goto out;
    }
  }
  /* llama.cpp's per-model token attributes, which reproduce HF's added_tokens flags that the
   * GGUF does not store: Phi-3's chat tokens and </s> swallow the whitespace after them. */
  size_t name_len = 0;
  const char *name = gguf_get_str(g, "general.name", &name_len);
  char lname[128] = {0};
  for (size_t i = 0; name && i < name_len && i + 1 < sizeof lname; i++)
    lname[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] + 32 : name[i]);
  if (strstr(lname, "phi-3") || strstr(lname, "phi3")) {
    for (int i = 0; i < t->num_added; i++) {
      const char *x = t->added[i].text;
      t->added[i].rstrip = strcmp(x, "<unk>") && strcmp(x, "<s>") && strcmp(x, "<|endoftext|>");
    }
  }
  if (is_spm) {
    t->model = TOKENIZER_MODEL_SPM;
    t->bos_id = get_id(g, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, n);
    t->eos_id = get_id(g, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, n);
    t->unk_id = get_id(g, "tokenizer.ggml.unknown_token_id", 0, n);
    t->add_bos = get_bool(g, "tokenizer.ggml.add_bos_token", 1);
    t->add_eos = get_bool(g, "tokenizer.ggml.add_eos_token", 0);
    t->spm_add_space = get_bool(g, "tokenizer.ggml.add_space_prefix", 1);
    t->byte_fallback = 1;
    /* The decoder of HF's Llama tokenizer.json: U+2581 -> ' ', byte tokens, strip one space. */
    struct decode_step rep = {DECODE_REPLACE, dup_str("\xe2\x96\x81"), dup_str(" "), 3, 1, 0, 0, 0};
    if (!rep.a || !rep.b || tokenizer_add_decode(t, rep))
      goto out;
    if (tokenizer_add_decode(t, (struct decode_step){DECODE_BYTE_FALLBACK, NULL, NULL, 0, 0, 0, 0, 0}))
      goto out;
    if (t->spm_add_space &&
        tokenizer_add_decode(t, (struct decode_step){DECODE_STRIP, NULL, NULL, 0, 0, 0, 1, ' '}))
      goto out;
  } else {
    t->model = TOKENIZER_MODEL_BPE;
    t->byte_level = 1;
    const struct pre_entry *pe = pre ? find_pre(pre, plen) : NULL;
    if (pre && !pe && !(plen == 7 && !memcmp(pre, "default", 7)))
      log_warn("%s: unknown tokenizer.ggml.pre '%.*s', using llama.cpp's default pre-tokenizer", path,
               (int)plen, pre);
    if (!pe)
      pe = &pre_default;
    for (int i = 0; i < 6 && pe->regexes[i]; i++)
      if (add_regex_step(t, pe->regexes[i]))
        goto out;
    /* Then the text is written in the byte alphabet, as HF's ByteLevel(use_regex=false). */
    struct pretokenize_step bl = {0};
    bl.kind = PRETOKENIZE_BYTE_LEVEL;
    if (pretokenizer_add(&t->pre, bl))
      goto out;
    t->ignore_merges = pe->ignore_merges;
    if (pe->nfc && normalizer_add(&t->norm, (struct normalize_step){.kind = NORMALIZE_NFC}))
      goto out;
    t->bos_id = get_id(g, "tokenizer.ggml.bos_token_id", n > 11 ? 11 : -1, n);
    t->eos_id = get_id(g, "tokenizer.ggml.eos_token_id", n > 11 ? 11 : -1, n);
    t->unk_id = get_id(g, "tokenizer.ggml.unknown_token_id", -1, n);
    t->add_bos = get_bool(g, "tokenizer.ggml.add_bos_token", pe->add_bos);
    t->add_eos = get_bool(g, "tokenizer.ggml.add_eos_token", 0);
    if (load_merges(t, g, path))
      goto out;
    if (tokenizer_add_decode(t, (struct decode_step){DECODE_BYTE_LEVEL, NULL, NULL, 0, 0, 0, 0, 0}))
      goto out;
  }
  int32_t eot = get_id(g, "tokenizer.ggml.eot_token_id", -1, n);
  int32_t eom = get_id(g, "tokenizer.ggml.eom_token_id", -1, n);
  if (eot >= 0)
    t->eog[eot] = 1;
  if (eom >= 0)
    t->eog[eom] = 1;
  size_t clen;
  const char *tmpl = gguf_get_str(g, "tokenizer.chat_template", &clen);
  if (tmpl) {
    t->chat_template = malloc(clen + 1);
    if (!t->chat_template) {
      ERR("out of memory");
      goto out;
    }
    memcpy(t->chat_template, tmpl, clen);
    t->chat_template[clen] = 0;
  }
  rc = 0;
out:
  gguf_close(g);
  return rc;
}
