/* test_api_text.c - the public tokenizer and chat-template API of pagoda.h, used as a client
 * would (this file includes only pagoda.h): the shared vocabulary cases (ids made by HF
 * tokenizers) through GGUF, a tokenizer.json and a model directory, the buffer-size contract,
 * add_special / parse_special / skip_special, error statuses, and the shared real templates
 * against the renderings Jinja2 made (templates/expected). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagoda.h"
#include "test_util.h"

#define SEP "\n__ggml_vocab_test__\n"

static char *shared_file(const char *rel, size_t *len) {
  const char *p = test_shared_path(rel);
  return p ? test_read_file(p, len) : NULL;
}

/* Parses one line of space-separated ids into IDS (cap MAX); returns the count. */
static int parse_ids(const char *line, size_t len, int32_t *ids, int max) {
  int n = 0;
  const char *p = line, *end = line + len;
  while (p < end && n < max) {
    while (p < end && *p == ' ')
      p++;
    if (p >= end)
      break;
    ids[n++] = (int32_t)strtol(p, (char **)&p, 10);
  }
  return n;
}

/* Every case of SUITE (.inp texts, .out ids) through the tokenizer at MODEL: encode gives HF's
 * ids and decode gives the text back. */
static void check_suite(const char *model, const char *suite) {
  char rel[256];
  size_t ilen, olen;
  snprintf(rel, sizeof rel, "%s.inp", suite);
  char *inp = shared_file(rel, &ilen);
  snprintf(rel, sizeof rel, "%s.out", suite);
  char *out = shared_file(rel, &olen);
  const char *mp = test_shared_path(model);
  pagoda_tokenizer_t *t = NULL;
  if (!inp || !out || !mp || pagoda_tokenizer_load(mp, &t) != PAGODA_OK) {
    CHECK(0, "%s: cannot load (%s)", model, pagoda_last_error());
    goto done;
  }
  CHECK(pagoda_tokenizer_vocab_size(t) > 1000, "%s: vocab size %d", model, pagoda_tokenizer_vocab_size(t));
  int cases = 0;
  char *text = inp, *line = out;
  for (char *sep; (sep = strstr(text, SEP)) != NULL; text = sep + strlen(SEP), cases++) {
    size_t tlen = (size_t)(sep - text);
    char *nl = strchr(line, '\n');
    size_t llen = nl ? (size_t)(nl - line) : strlen(line);
    int32_t want[512], got[512];
    int nw = parse_ids(line, llen, want, 512);
    line = nl ? nl + 1 : line + llen;
    int full = pagoda_tokenizer_encode(t, text, tlen, 0, 0, NULL, 0); /* size query */
    int n = pagoda_tokenizer_encode(t, text, tlen, 0, 0, got, 512);
    CHECK(full == n, "%s case %d: size query %d, encode %d", model, cases, full, n);
    CHECK(n == nw && memcmp(got, want, (size_t)nw * sizeof *got) == 0, "%s case %d: '%.*s': %d ids, HF %d",
          model, cases, (int)tlen, text, n, nw);
    if (n != nw)
      continue;
    int need = pagoda_tokenizer_decode(t, got, n, 0, NULL, 0);
    char buf[4096];
    CHECK(need == (int)tlen, "%s case %d: decode length %d, text %zu", model, cases, need, tlen);
    if (need >= 0 && need < (int)sizeof buf) {
      CHECK(pagoda_tokenizer_decode(t, got, n, 0, buf, sizeof buf) == need, "%s: decode", model);
      CHECK(buf[need] == 0 && memcmp(buf, text, tlen) == 0, "%s case %d: decode '%s'", model, cases, buf);
      if (need > 1) { /* a short buffer: the full length comes back, the text is cut and terminated */
        CHECK(pagoda_tokenizer_decode(t, got, n, 0, buf, 2) == need && buf[1] == 0, "%s: short cap", model);
      }
    }
  }
  CHECK(cases >= 10, "%s: only %d cases", suite, cases);
  printf("  %-40s %d cases\n", model, cases);
done:
  pagoda_tokenizer_free(t);
  free(inp);
  free(out);
}

static void check_special_flags(void) {
  const char *mp = test_shared_path("vocab/ggml-vocab-llama-spm.gguf");
  pagoda_tokenizer_t *t;
  if (!mp || pagoda_tokenizer_load(mp, &t) != PAGODA_OK) {
    CHECK(0, "llama-spm: %s", pagoda_last_error());
    return;
  }
  int32_t a[16], b[16];
  int na = pagoda_tokenizer_encode(t, "Hello", 5, 0, 0, a, 16);
  int nb = pagoda_tokenizer_encode(t, "Hello", 5, 1, 0, b, 16);
  CHECK(pagoda_tokenizer_bos_id(t) == 1, "bos id %d", pagoda_tokenizer_bos_id(t));
  CHECK(nb == na + 1 && b[0] == 1 && memcmp(b + 1, a, (size_t)na * sizeof *a) == 0, "add_special adds BOS");
  int n = pagoda_tokenizer_encode(t, "<s>", 3, 0, 1, a, 16);
  CHECK(n == 1 && a[0] == 1, "parse_special: <s> -> [1], got %d ids", n);
  n = pagoda_tokenizer_encode(t, "<s>", 3, 0, 0, a, 16);
  CHECK(!(n == 1 && a[0] == 1), "without parse_special <s> is text");
  const int32_t ids[2] = {1, 15043};
  char buf[64];
  CHECK(pagoda_tokenizer_decode(t, ids, 2, 0, buf, sizeof buf) == 9 && !strcmp(buf, "<s> Hello"), "'%s'", buf);
  CHECK(pagoda_tokenizer_decode(t, ids, 2, 1, buf, sizeof buf) == 5 && !strcmp(buf, "Hello"), "'%s'", buf);
  const int32_t bad = 1 << 30;
  CHECK(pagoda_tokenizer_decode(t, &bad, 1, 0, buf, sizeof buf) == -1 && *pagoda_last_error(),
        "an id out of range is an error");
  CHECK(pagoda_tokenizer_encode(t, "x", 1, 0, 0, NULL, 4) == -1, "NULL ids with max_ids > 0");
  pagoda_tokenizer_free(t);
}

static void check_load_errors(void) {
  pagoda_tokenizer_t *t = (pagoda_tokenizer_t *)&t;
  CHECK(pagoda_tokenizer_load("/nonexistent/tokenizer.json", &t) == PAGODA_ERR_IO && t == NULL, "missing file");
  CHECK(strstr(pagoda_last_error(), "/nonexistent/tokenizer.json") != NULL, "names the file: %s",
        pagoda_last_error());
  const char *tmpl = test_shared_path("templates/Qwen-Qwen2.5-7B-Instruct.jinja"); /* not a tokenizer */
  if (tmpl)
    CHECK(pagoda_tokenizer_load(tmpl, &t) == PAGODA_ERR_FORMAT && t == NULL, "not a tokenizer: %s",
          pagoda_last_error());
  CHECK(pagoda_tokenizer_load(NULL, &t) == PAGODA_ERR_INVALID_ARG, "NULL path");
  pagoda_tokenizer_free(NULL);
}

/* The template of a model directory is what tokenizer_config.json holds, and renders. */
static void check_model_template(void) {
  const char *mp = test_shared_path("tokenizers/phi-3-mini");
  pagoda_tokenizer_t *t;
  if (!mp || pagoda_tokenizer_load(mp, &t) != PAGODA_OK) {
    CHECK(0, "phi-3-mini: %s", pagoda_last_error());
    return;
  }
  const char *src = pagoda_tokenizer_chat_template(t);
  CHECK(src && strstr(src, "<|user|>"), "phi-3-mini has a chat template with <|user|>");
  const char *ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true}";
  char *out = NULL;
  size_t len = 0;
  CHECK(src && pagoda_render_template(src, ctx, strlen(ctx), &out, &len) == PAGODA_OK, "%s", pagoda_last_error());
  CHECK(out && strstr(out, "<|user|>\nHi<|end|>\n<|assistant|>\n") && strlen(out) == len, "rendered '%s'",
        out ? out : "(null)");
  free(out);
  pagoda_tokenizer_free(t);
}

/* The shared real templates, each with each shared context, against Jinja2's renderings. */
static void check_shared_templates(void) {
  static const char *templates[] = {"Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
                                    "microsoft-Phi-3.5-mini-instruct", "mistralai-Mistral-Nemo-Instruct-2407"};
  static const char *contexts[] = {"01_user", "02_system_user", "03_multiturn", "04_no_gen_prompt", "05_tools",
                                   "06_bad_roles"};
  int ok_cases = 0, err_cases = 0;
  const char *ep = test_shared_path("templates/expected");
  if (!ep) {
    CHECK(0, "templates/expected is missing");
    return;
  }
  char expected[PATH_MAX];
  snprintf(expected, sizeof expected, "%s", ep);
  for (size_t i = 0; i < sizeof templates / sizeof *templates; i++) {
    char rel[256];
    size_t tl, cl, el;
    snprintf(rel, sizeof rel, "templates/%s.jinja", templates[i]);
    char *tmpl = shared_file(rel, &tl);
    for (size_t j = 0; tmpl && j < sizeof contexts / sizeof *contexts; j++) {
      snprintf(rel, sizeof rel, "templates/contexts/%s.json", contexts[j]);
      char *ctx = shared_file(rel, &cl);
      /* Jinja2's rendering (NAME.out), or its error message (NAME.err) */
      char path[PATH_MAX + 256];
      snprintf(path, sizeof path, "%s/%s__%s.out", expected, templates[i], contexts[j]);
      char *want = test_read_file(path, &el);
      int want_ok = want != NULL;
      if (!want_ok) {
        snprintf(path, sizeof path, "%s/%s__%s.err", expected, templates[i], contexts[j]);
        want = test_read_file(path, &el);
      }
      char *out = NULL;
      size_t len = 0;
      int st = ctx ? pagoda_render_template(tmpl, ctx, cl, &out, &len) : -1;
      if (want && want_ok) {
        CHECK(st == PAGODA_OK && len == el && memcmp(out, want, el) == 0, "%s with %s: status %d", templates[i],
              contexts[j], st);
        ok_cases++;
      } else if (want) { /* the .err file is the message plus the CLI's newline */
        CHECK(st == PAGODA_ERR_FORMAT && out == NULL, "%s with %s must fail, status %d", templates[i], contexts[j],
              st);
        CHECK(el > 0 && strlen(pagoda_last_error()) == el - 1 && !memcmp(pagoda_last_error(), want, el - 1),
              "%s with %s: message '%s'", templates[i], contexts[j], pagoda_last_error());
        err_cases++;
      }
      free(out);
      free(want);
      free(ctx);
    }
    free(tmpl);
  }
  printf("  shared templates: %d renderings, %d raised errors\n", ok_cases, err_cases);
  CHECK(ok_cases + err_cases == 24 && err_cases > 0, "%d + %d shared cases", ok_cases, err_cases);

  char *out = (char *)&out;
  size_t len = 7;
  CHECK(pagoda_render_template("x", "[1, 2]", 6, &out, &len) == PAGODA_ERR_INVALID_ARG && out == NULL && len == 0,
        "an array context is refused");
  CHECK(pagoda_render_template("x", "{bad", 4, &out, &len) == PAGODA_ERR_INVALID_ARG, "malformed JSON");
  const char *raise = "{{ raise_exception('Bad: ' ~ n) }}";
  CHECK(pagoda_render_template(raise, "{\"n\": 3}", 8, &out, &len) == PAGODA_ERR_FORMAT &&
            !strcmp(pagoda_last_error(), "Bad: 3"),
        "raise_exception: '%s'", pagoda_last_error());
  /* a context that is not NUL-terminated: only CONTEXT_LEN bytes are read */
  CHECK(pagoda_render_template("{{ a }}", "{\"a\": 1.0}garbage", 10, &out, &len) == PAGODA_OK && len == 3 &&
            !strcmp(out, "1.0"),
        "context_len bounds the JSON; 1.0 stays a float");
  free(out);
}

int main(void) {
  if (!test_shared_path("vocab"))
    return test_skip("shared test data absent");
  check_suite("vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-llama-spm.gguf");
  check_suite("vocab/ggml-vocab-phi-3.gguf", "vocab/ggml-vocab-phi-3.gguf");
  check_suite("vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-gpt-2.gguf");
  check_suite("tokenizers/phi-3-mini/tokenizer.json", "vocab/ggml-vocab-phi-3.gguf");
  check_suite("tokenizers/phi-3-mini", "vocab/ggml-vocab-phi-3.gguf");
  check_special_flags();
  check_load_errors();
  check_model_template();
  check_shared_templates();
  return test_finish("test_api_text");
}
