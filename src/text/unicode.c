/* unicode.c - UTF-8 helpers, the byte-level alphabet and character classes (via utf8proc). */
#include "text/unicode.h"

#include <string.h>
#include <utf8proc.h>

int unicode_utf8_len(uint8_t b) {
  if (b < 0xC2)
    return 1;
  if (b < 0xE0)
    return 2;
  if (b < 0xF0)
    return 3;
  if (b < 0xF5)
    return 4;
  return 1;
}

/* Valid range of the second byte after lead B (the first continuation byte is the one that
 * excludes overlongs, surrogates and code points past U+10FFFF). */
static void second_byte_range(uint8_t b, uint8_t *lo, uint8_t *hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b == 0xE0)
    *lo = 0xA0;
  else if (b == 0xED)
    *hi = 0x9F;
  else if (b == 0xF0)
    *lo = 0x90;
  else if (b == 0xF4)
    *hi = 0x8F;
}

int unicode_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
  uint8_t b = s[0];
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  if (b < 0xC2 || b > 0xF4)
    return 0;
  int len = unicode_utf8_len(b);
  if ((size_t)len > n)
    return 0;
  uint8_t lo, hi;
  second_byte_range(b, &lo, &hi);
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (int i = 2; i < len; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  uint32_t c = b & (0x7F >> len);
  for (int i = 1; i < len; i++)
    c = (c << 6) | (s[i] & 0x3F);
  *cp = c;
  return len;
}

int unicode_utf8_encode(uint32_t cp, char *out) {
  uint8_t *o = (uint8_t *)out;
  if (cp < 0x80) {
    o[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (uint8_t)(0xC0 | (cp >> 6));
    o[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (uint8_t)(0xE0 | (cp >> 12));
    o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (uint8_t)(0xF0 | (cp >> 18));
  o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

int unicode_utf8_valid(const char *s, size_t n) {
  const uint8_t *p = (const uint8_t *)s;
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      i++;
      continue;
    }
    uint32_t cp;
    int l = unicode_utf8_decode(p + i, n - i, &cp);
    if (!l)
      return 0;
    i += (size_t)l;
  }
  return 1;
}

int utf8_stream_push(struct utf8_stream *s, uint8_t b, char *out) {
  int w = 0;
  if (s->num_pending) {
    uint8_t lead = s->pending[0];
    uint8_t lo = 0x80, hi = 0xBF;
    if (s->num_pending == 1)
      second_byte_range(lead, &lo, &hi);
    if (b >= lo && b <= hi) {
      s->pending[s->num_pending++] = b;
      if (s->num_pending == unicode_utf8_len(lead)) {
        memcpy(out, s->pending, (size_t)s->num_pending);
        w = s->num_pending;
        s->num_pending = 0;
      }
      return w;
    }
    /* The held bytes are a maximal invalid subpart: one U+FFFD, then B starts afresh. */
    w = unicode_utf8_encode(UNICODE_REPLACEMENT, out);
    s->num_pending = 0;
  }
  if (b < 0x80) {
    out[w++] = (char)b;
  } else if (b >= 0xC2 && b <= 0xF4) {
    s->pending[0] = b;
    s->num_pending = 1;
  } else {
    w += unicode_utf8_encode(UNICODE_REPLACEMENT, out + w);
  }
  return w;
}

int utf8_stream_flush(struct utf8_stream *s, char *out) {
  if (!s->num_pending)
    return 0;
  s->num_pending = 0;
  return unicode_utf8_encode(UNICODE_REPLACEMENT, out);
}

size_t unicode_utf8_repair(const char *s, size_t n, char *out) {
  struct utf8_stream st = {{0}, 0};
  size_t w = 0;
  for (size_t i = 0; i < n; i++)
    w += (size_t)utf8_stream_push(&st, (uint8_t)s[i], out + w);
  w += (size_t)utf8_stream_flush(&st, out + w);
  return w;
}

/* Bytes that GPT-2 prints as themselves: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF; the other
 * 68 bytes are moved to U+0100.. in byte order so every byte has a visible character. */
static int byte_is_printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t unicode_byte_to_cp(uint8_t b) {
  if (byte_is_printable(b))
    return b;
  /* The 68 others in byte order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD. */
  if (b <= 0x20)
    return 256u + b;
  if (b >= 0x7F && b <= 0xA0)
    return 256u + 33u + (uint32_t)(b - 0x7F);
  return 256u + 67u;
}

int unicode_cp_to_byte(uint32_t cp) {
  if (cp < 256)
    return byte_is_printable((int)cp) ? (int)cp : -1;
  if (cp < 256 + 33)
    return (int)(cp - 256);
  if (cp < 256 + 67)
    return (int)(cp - 256 - 33 + 0x7F);
  if (cp == 256 + 67)
    return 0xAD;
  return -1;
}

int unicode_is_whitespace(uint32_t cp) {
  if ((cp >= 9 && cp <= 13) || cp == ' ' || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
      cp == 0x205F || cp == 0x3000)
    return 1;
  return 0;
}

int unicode_is_numeric(uint32_t cp) {
  if (cp < 0x80)
    return cp >= '0' && cp <= '9';
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int unicode_is_punct(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

int unicode_is_alnum(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

int unicode_is_mark(uint32_t cp) {
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}

int unicode_is_word(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D)
    return 1;
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || c == UTF8PROC_CATEGORY_NL ||
         c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC ||
         c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_PC;
}
