/* api_text.c - the public tokenizer and chat-template API (pagoda.h): thin wrappers over
 * text/tokenizer.h and text/chat_template.h that map their errors to pagoda_status values. */
#include <stdlib.h>

#include "pagoda.h"
#include "text/chat_template.h"
#include "text/jinja_render.h"
#include "text/tokenizer.h"
#include "util/file.h"
#include "util/log.h"

struct pagoda_tokenizer {
  struct tokenizer *tok;
};

int pagoda_tokenizer_load(const char *path, pagoda_tokenizer_t **out) {
  if (!out)
    return ERR("pagoda_tokenizer_load: OUT is NULL"), PAGODA_ERR_INVALID_ARG;
  *out = NULL;
  if (!path || !*path)
    return ERR("no tokenizer path given"), PAGODA_ERR_INVALID_ARG;
  struct pagoda_tokenizer *t = calloc(1, sizeof *t);
  if (!t)
    return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
  if (!(t->tok = tokenizer_load(path))) {
    free(t);
    return file_exists(path) ? PAGODA_ERR_FORMAT : PAGODA_ERR_IO;
  }
  *out = t;
  return PAGODA_OK;
}

void pagoda_tokenizer_free(pagoda_tokenizer_t *t) {
  if (!t)
    return;
  tokenizer_free(t->tok);
  free(t);
}

int pagoda_tokenizer_encode(const pagoda_tokenizer_t *t, const char *text, size_t len, int add_special,
                            int parse_special, int32_t *ids, int max_ids) {
  if (!t || (!text && len) || max_ids < 0 || (!ids && max_ids))
    return ERR("pagoda_tokenizer_encode: bad arguments");
  return tokenizer_encode(t->tok, text ? text : "", len, add_special, parse_special, ids, max_ids);
}

int pagoda_tokenizer_decode(const pagoda_tokenizer_t *t, const int32_t *ids, int n, int skip_special,
                            char *out, size_t cap) {
  if (!t || n < 0 || (!ids && n) || (!out && cap))
    return ERR("pagoda_tokenizer_decode: bad arguments");
  return tokenizer_decode(t->tok, ids, n, skip_special, out, cap);
}

int pagoda_tokenizer_vocab_size(const pagoda_tokenizer_t *t) { return tokenizer_vocab_size(t->tok); }
int pagoda_tokenizer_bos_id(const pagoda_tokenizer_t *t) { return tokenizer_bos_id(t->tok); }
int pagoda_tokenizer_eos_id(const pagoda_tokenizer_t *t) { return tokenizer_eos_id(t->tok); }
const char *pagoda_tokenizer_chat_template(const pagoda_tokenizer_t *t) { return tokenizer_chat_template(t->tok); }

/* where the last pagoda_render_template error of this thread was (0: unknown) */
static _Thread_local int tl_error_line, tl_error_col;

int pagoda_template_error_location(int *line, int *col) {
  if (line) *line = tl_error_line;
  if (col) *col = tl_error_col;
  return tl_error_line > 0;
}

int pagoda_render_template(const char *template_src, const char *context_json, size_t context_len,
                           char **out, size_t *out_len) {
  if (!out || !out_len || !template_src || (!context_json && context_len))
    return ERR("pagoda_render_template: bad arguments"), PAGODA_ERR_INVALID_ARG;
  *out = NULL;
  *out_len = 0;
  tl_error_line = tl_error_col = 0;
  cJSON *ctx = jinja_context_parse(context_json ? context_json : "", context_len);
  if (!ctx || !cJSON_IsObject(ctx)) {
    cJSON_Delete(ctx);
    return ERR("the context is not a JSON object"), PAGODA_ERR_INVALID_ARG;
  }
  char *err = NULL;
  *out = chat_template_render_loc(template_src, ctx, out_len, &err, &tl_error_line, &tl_error_col);
  cJSON_Delete(ctx);
  if (!*out) {
    /* no file:line prefix in the user message: err_last() gives the template's text as is */
    ERR("%s", err ? err : "template error");
    free(err);
    return PAGODA_ERR_FORMAT;
  }
  return PAGODA_OK;
}
