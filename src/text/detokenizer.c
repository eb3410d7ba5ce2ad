/* detokenizer.c - ids -> text: each token's text goes through the decoder chain (ByteLevel,
 * ByteFallback, Replace, Metaspace, Strip), and the byte stream through a lossy UTF-8 stage
 * that holds back an incomplete character. tokenizer_decode is the same machine run to the
 * end, so streamed deltas always concatenate to the full decode. */
#include <stdlib.h>
#include <string.h>

#include "text/text_buf.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"
#include "util/log.h"

struct detokenizer {
  const struct tokenizer *t;
  int skip_special;
  int index;        /* tokens decoded so far (after skipping): Metaspace treats the first apart */
  int strip_left;   /* leading Strip characters still to drop */
  /* ByteFallback: the bytes of the current run of <0xNN> tokens, held until the run ends (a
   * token that is not a byte, or the end): HF emits the run as its text when the whole run is
   * valid UTF-8, else one U+FFFD per byte, so no byte of a run can be released early. */
  int bf_step;      /* index of the ByteFallback step in t->dec */
  struct text_buf run, run_piece;
  /* out: complete UTF-8 not yet handed to the caller (what did not fit in the last cap) */
  struct utf8_stream utf8;
  struct text_buf piece, tmp, out;
};

static void detok_init(struct detokenizer *d, const struct tokenizer *t, int skip_special) {
  memset(d, 0, sizeof *d);
  d->t = t;
  d->skip_special = skip_special;
  for (int i = 0; i < t->num_dec; i++)
    if (t->dec[i].kind == DECODE_STRIP)
      d->strip_left = t->dec[i].count;
}

static void detok_release(struct detokenizer *d) {
  text_buf_free(&d->run);
  text_buf_free(&d->run_piece);
  text_buf_free(&d->piece);
  text_buf_free(&d->tmp);
  text_buf_free(&d->out);
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

static int is_byte_token(const char *s, size_t n) {
  return n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0;
}

/* One decoder step over the token text in d->piece (result left in d->piece). Returns 0, 1
 * when the token was taken into the ByteFallback run (nothing to pass on), or -1 on error. */
static int decode_step(struct detokenizer *d, const struct decode_step *st) {
  struct text_buf *in = &d->piece, *out = &d->tmp;
  out->len = 0;
  const char *s = in->data;
  size_t n = in->len;
  switch (st->kind) {
  case DECODE_BYTE_FALLBACK:
    if (is_byte_token(s, n)) {
      char b = (char)(hexval(s[3]) * 16 + hexval(s[4]));
      if (text_buf_append(&d->run, &b, 1))
        return ERR("out of memory");
      return 1; /* held in the run */
    }
    return 0;
  case DECODE_BYTE_LEVEL: {
    if (text_buf_reserve(out, n))
      return ERR("out of memory");
    for (size_t i = 0; i < n;) {
      uint32_t cp;
      int l = unicode_utf8_decode((const uint8_t *)s + i, n - i, &cp);
      int b = l ? unicode_cp_to_byte(cp) : -1;
      if (b < 0)
        return 0; /* not written in the byte alphabet: the token's own bytes, as HF does */
      out->data[out->len++] = (char)b;
      i += (size_t)l;
    }
    break;
  }
  case DECODE_REPLACE:
  case DECODE_METASPACE: {
    const char *to = st->kind == DECODE_REPLACE ? st->b : " ";
    size_t to_len = st->kind == DECODE_REPLACE ? st->b_len : 1;
    if (st->kind == DECODE_METASPACE && st->strip_first && d->index == 0)
      to_len = 0; /* HF's Metaspace decoder drops the replacement in the first token */
    size_t pos = 0;
    while (st->a_len && pos < n) {
      const char *hit = memmem(s + pos, n - pos, st->a, st->a_len);
      if (!hit)
        break;
      if (text_buf_append(out, s + pos, (size_t)(hit - s) - pos) || text_buf_append(out, to, to_len))
        return ERR("out of memory");
      pos = (size_t)(hit - s) + st->a_len;
    }
    if (text_buf_append(out, s + pos, n - pos))
      return ERR("out of memory");
    break;
  }
  case DECODE_STRIP:
    return 0; /* applied to the fused output in detok_push */
  }
  struct text_buf tb = *in;
  *in = *out;
  *out = tb;
  return 0;
}

/* Sends the text in d->piece through decoder steps FROM.. and appends the completed UTF-8 to
 * d->out. */
static int detok_steps(struct detokenizer *d, int from);

/* Ends the current ByteFallback run: its bytes (valid UTF-8) or one U+FFFD per byte go through
 * the steps after ByteFallback as one token, as HF's decode_chain does. */
static int detok_end_run(struct detokenizer *d) {
  if (!d->run.len)
    return 0;
  struct text_buf saved = d->piece;
  d->piece = d->run_piece;
  d->piece.len = 0;
  int rc = 0;
  size_t n = d->run.len;
  int valid = 1;
  for (size_t i = 0; i < n && valid;) {
    uint32_t cp;
    int l = unicode_utf8_decode((const uint8_t *)d->run.data + i, n - i, &cp);
    if (!l)
      valid = 0;
    i += (size_t)l;
  }
  if (valid)
    rc = text_buf_append(&d->piece, d->run.data, n) ? ERR("out of memory") : 0;
  else
    for (size_t i = 0; i < n && !rc; i++)
      rc = text_buf_append(&d->piece, "\xEF\xBF\xBD", 3) ? ERR("out of memory") : 0;
  d->run.len = 0;
  if (!rc)
    rc = detok_steps(d, d->bf_step + 1);
  d->run_piece = d->piece;
  d->piece = saved;
  return rc;
}

static int detok_steps(struct detokenizer *d, int from) {
  const struct tokenizer *t = d->t;
  for (int i = from; i < t->num_dec; i++) {
    if (t->dec[i].kind == DECODE_BYTE_FALLBACK) {
      d->bf_step = i;
      if (d->run.len && !is_byte_token(d->piece.data, d->piece.len) && detok_end_run(d))
        return -1;
    }
    int rc = decode_step(d, &t->dec[i]);
    if (rc < 0)
      return -1;
    if (rc > 0)
      return 0;
  }
  d->index++;
  if (text_buf_reserve(&d->out, d->piece.len * 4 + 8))
    return ERR("out of memory");
  char strip_ch = ' ';
  for (int i = 0; i < t->num_dec; i++)
    if (t->dec[i].kind == DECODE_STRIP)
      strip_ch = t->dec[i].ch;
  for (size_t i = 0; i < d->piece.len; i++) {
    char c = d->piece.data[i];
    if (d->strip_left > 0) {
      if (c == strip_ch) {
        d->strip_left--;
        continue;
      }
      d->strip_left = 0;
    }
    d->out.len += (size_t)utf8_stream_push(&d->utf8, (uint8_t)c, d->out.data + d->out.len);
  }
  return 0;
}

/* Decodes ID and appends the completed UTF-8 to d->out. */
static int detok_push(struct detokenizer *d, int32_t id) {
  const struct tokenizer *t = d->t;
  if (id < 0 || id >= t->vocab.n)
    return ERR("token id %d out of range (vocabulary of %d)", (int)id, t->vocab.n);
  if (d->skip_special && t->special[id])
    return 0;
  size_t len;
  const char *s = tokenizer_decode_text(t, id, &len);
  d->piece.len = 0;
  if (s && text_buf_append(&d->piece, s, len))
    return ERR("out of memory");
  return detok_steps(d, 0);
}

static int detok_flush(struct detokenizer *d) {
  if (detok_end_run(d))
    return -1;
  if (text_buf_reserve(&d->out, 4))
    return ERR("out of memory");
  d->out.len += (size_t)utf8_stream_flush(&d->utf8, d->out.data + d->out.len);
  return 0;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, int skip_special, char *out,
                     size_t cap) {
  if (!t || n < 0 || (n > 0 && !ids))
    return ERR("tokenizer_decode: bad arguments");
  struct detokenizer d;
  detok_init(&d, t, skip_special);
  int rc = 0;
  for (int i = 0; i < n && !rc; i++)
    rc = detok_push(&d, ids[i]);
  if (!rc)
    rc = detok_flush(&d);
  if (!rc && d.out.len > (size_t)INT32_MAX - 1)
    rc = ERR("decoded text too long");
  if (!rc) {
    if (out && cap > 0) {
      size_t k = d.out.len < cap - 1 ? d.out.len : cap - 1;
      if (k)
        memcpy(out, d.out.data, k);
      out[k] = 0;
    }
    rc = (int)d.out.len;
  }
  detok_release(&d);
  return rc;
}

struct detokenizer *detokenizer_create(const struct tokenizer *t, int skip_special) {
  if (!t) {
    ERR("detokenizer_create: no tokenizer");
    return NULL;
  }
  struct detokenizer *d = malloc(sizeof *d);
  if (!d) {
    ERR("out of memory");
    return NULL;
  }
  detok_init(d, t, skip_special);
  return d;
}

void detokenizer_free(struct detokenizer *d) {
  if (!d)
    return;
  detok_release(d);
  free(d);
}

void detokenizer_reset(struct detokenizer *d) {
  const struct tokenizer *t = d->t;
  int skip = d->skip_special;
  struct text_buf a = d->piece, b = d->tmp, c = d->out, r = d->run, rp = d->run_piece;
  detok_init(d, t, skip);
  d->piece = a;
  d->tmp = b;
  d->out = c;
  d->out.len = 0;
  d->run = r;
  d->run.len = 0;
  d->run_piece = rp;
}

void detokenizer_set_continuation(struct detokenizer *d) {
  if (!d)
    return;
  /* A byte-fallback run held from the (discarded) prompt is dropped, except an unfinished last
   * character, which the continuation may complete. */
  size_t k = 0, n = d->run.len;
  while (k < n) {
    uint32_t cp;
    int l = unicode_utf8_decode((const uint8_t *)d->run.data + k, n - k, &cp);
    if (!l)
      break;
    k += (size_t)l;
  }
  size_t keep = 0;
  if (k < n && (size_t)unicode_utf8_len((uint8_t)d->run.data[k]) > n - k &&
      (uint8_t)d->run.data[k] >= 0xC2)
    keep = n - k;
  if (keep)
    memmove(d->run.data, d->run.data + n - keep, keep);
  d->run.len = keep;
  d->strip_left = 0;
  if (d->index == 0)
    d->index = 1;
}

/* Moves the held text to OUT: all of it when it fits, else the longest prefix that ends on a
 * character boundary; the rest stays for the next call (so deltas still concatenate to the
 * full decode, whatever CAP is, as long as it holds one character). */
static int take_output(struct detokenizer *d, char *out, size_t cap) {
  if (!out || cap < 5)
    return ERR("detokenizer output buffer too small (%zu bytes; at least 5)", cap);
  size_t n = d->out.len;
  if (n > cap - 1) {
    n = cap - 1;
    while (n > 0 && ((uint8_t)d->out.data[n] & 0xC0) == 0x80)
      n--; /* d->out holds only complete characters: back up to a lead byte */
  }
  if (n)
    memcpy(out, d->out.data, n);
  out[n] = 0;
  if (d->out.len > n)
    memmove(d->out.data, d->out.data + n, d->out.len - n);
  d->out.len -= n;
  return (int)n;
}

int detokenizer_push(struct detokenizer *d, int32_t id, char *out, size_t cap) {
  if (!d)
    return ERR("detokenizer_push: no detokenizer");
  if (detok_push(d, id))
    return -1;
  return take_output(d, out, cap);
}

int detokenizer_flush(struct detokenizer *d, char *out, size_t cap) {
  if (!d)
    return ERR("detokenizer_flush: no detokenizer");
  if (detok_flush(d))
    return -1;
  return take_output(d, out, cap);
}
