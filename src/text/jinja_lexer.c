/* jinja_lexer.c - the chat-template tokenizer; follows Jinja2 3.1's lexer rules for whitespace
 * control (trim_blocks=True, lstrip_blocks=True), raw blocks, literals and operators. */
#include "text/jinja_lexer.h"

#include <stdlib.h>
#include <string.h>

struct jinja_lexer {
  struct jinja_state *st;
  const char *s; /* (n) source with newlines normalized to \n */
  size_t n, pos;
  int line;
  int line_starting; /* the last consumed piece ended with \n (or nothing consumed yet) */
  struct jinja_token *toks;
  size_t num_toks, cap;
};

static int jinja_is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static struct jinja_token *jinja_lex_push(struct jinja_lexer *lx, enum jinja_tok type) {
  if (lx->num_toks == lx->cap) {
    size_t cap = lx->cap ? lx->cap * 2 : 64;
    struct jinja_token *t = jinja_alloc(lx->st, cap * sizeof(*t));
    if (lx->num_toks)
      memcpy(t, lx->toks, lx->num_toks * sizeof(*t));
    lx->toks = t;
    lx->cap = cap;
  }
  struct jinja_token *t = &lx->toks[lx->num_toks++];
  memset(t, 0, sizeof(*t));
  t->type = type;
  t->line = lx->line;
  t->pos = lx->pos;
  t->text = "";
  return t;
}

static void jinja_count_lines(struct jinja_lexer *lx, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (lx->s[i] == '\n')
      lx->line++;
}

/* Emits template text [from, to), first applying the strip rules of the tag that follows
 * (SIGN is '-', '+' or 0; LSTRIP says the tag is a block or comment, which lstrip_blocks covers). */
static void jinja_lex_text(struct jinja_lexer *lx, size_t from, size_t to, char sign, int lstrip) {
  size_t end = to;
  if (sign == '-') {
    while (end > from && jinja_is_space(lx->s[end - 1]))
      end--;
  } else if (sign != '+' && lstrip) {
    size_t l = end;
    while (l > from && lx->s[l - 1] != '\n')
      l--;
    if (l > from || lx->line_starting) {
      size_t k = l;
      while (k < end && jinja_is_space(lx->s[k]))
        k++;
      if (k == end)
        end = l;
    }
  }
  if (end > from) {
    struct jinja_token *t = jinja_lex_push(lx, JINJA_TOK_TEXT);
    t->value = jinja_str_n(lx->st, lx->s + from, end - from);
  }
  jinja_count_lines(lx, from, to);
}

/* After a block or comment end at lx->pos (just past the delimiter): - strips all following
 * whitespace, + keeps it, otherwise trim_blocks drops one newline. */
static void jinja_lex_after_end(struct jinja_lexer *lx, char sign, int trim) {
  size_t start = lx->pos;
  if (sign == '-') {
    while (lx->pos < lx->n && jinja_is_space(lx->s[lx->pos]))
      lx->pos++;
  } else if (sign != '+' && trim && lx->pos < lx->n && lx->s[lx->pos] == '\n') {
    lx->pos++;
  }
  jinja_count_lines(lx, start, lx->pos);
  lx->line_starting = lx->pos > start && lx->s[lx->pos - 1] == '\n';
}

static int jinja_hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static void jinja_put_utf8(struct jinja_buf *b, uint32_t cp) {
  char u[4];
  size_t k;
  if (cp < 0x80) {
    u[0] = (char)cp;
    k = 1;
  } else if (cp < 0x800) {
    u[0] = (char)(0xC0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3F));
    k = 2;
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12));
    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F));
    k = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (char)(0x80 | (cp & 0x3F));
    k = 4;
  }
  jinja_buf_add(b, u, k);
}

/* Decodes a string literal body the way Python's unicode-escape codec does (Jinja2 uses it). */
static struct jinja_value jinja_unescape(struct jinja_lexer *lx, const char *s, size_t n) {
  struct jinja_buf b;
  jinja_buf_init(&b, lx->st, 0, JINJA_MAX_OUTPUT);
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\' || i + 1 >= n) {
      jinja_buf_add(&b, s + i, 1);
      continue;
    }
    char c = s[++i];
    const char *rep = NULL;
    switch (c) {
    case '\n':
      rep = "";
      break;
    case '\\':
      rep = "\\";
      break;
    case '\'':
      rep = "'";
      break;
    case '"':
      rep = "\"";
      break;
    case 'a':
      rep = "\a";
      break;
    case 'b':
      rep = "\b";
      break;
    case 'f':
      rep = "\f";
      break;
    case 'n':
      rep = "\n";
      break;
    case 'r':
      rep = "\r";
      break;
    case 't':
      rep = "\t";
      break;
    case 'v':
      rep = "\v";
      break;
    default:
      break;
    }
    if (rep) {
      jinja_buf_adds(&b, rep);
      continue;
    }
    if (c >= '0' && c <= '7') {
      uint32_t v = 0;
      int k = 0;
      while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7') {
        v = v * 8 + (uint32_t)(s[i] - '0');
        i++;
        k++;
      }
      i--;
      jinja_put_utf8(&b, v);
      continue;
    }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
      uint32_t v = 0;
      for (int k = 0; k < digits; k++) {
        int h = i + 1 + (size_t)k < n ? jinja_hexval(s[i + 1 + (size_t)k]) : -1;
        if (h < 0)
          jinja_fail(lx->st,
                     "(unicode error) 'unicodeescape' codec can't decode bytes: truncated \\%cXX escape",
                     c);
        v = v * 16 + (uint32_t)h;
      }
      if (v > 0x10FFFF)
        jinja_fail(
            lx->st,
            "(unicode error) 'unicodeescape' codec can't decode bytes: illegal Unicode character");
      i += (size_t)digits;
      jinja_put_utf8(&b, v);
      continue;
    }
    /* Unknown escape: Python keeps the backslash. */
    jinja_buf_add(&b, "\\", 1);
    jinja_buf_add(&b, &c, 1);
  }
  return jinja_buf_value(&b);
}

static int jinja_is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int jinja_is_name_char(char c) { return jinja_is_name_start(c) || (c >= '0' && c <= '9'); }
static int jinja_is_digit(char c) { return c >= '0' && c <= '9'; }

/* Digits with single underscores between them ("1_000"); returns the end position. */
static size_t jinja_scan_digits(const char *s, size_t n, size_t p) {
  if (p >= n || !jinja_is_digit(s[p]))
    return p;
  p++;
  while (p < n) {
    if (jinja_is_digit(s[p]))
      p++;
    else if (s[p] == '_' && p + 1 < n && jinja_is_digit(s[p + 1]))
      p += 2;
    else
      break;
  }
  return p;
}

static void jinja_lex_number(struct jinja_lexer *lx) {
  const char *s = lx->s;
  size_t p = lx->pos, n = lx->n;
  /* Hex, octal and binary integers. */
  if (s[p] == '0' && p + 1 < n && strchr("xXoObB", s[p + 1])) {
    int base = (s[p + 1] | 0x20) == 'x' ? 16 : (s[p + 1] | 0x20) == 'o' ? 8 : 2;
    size_t q = p + 2;
    int64_t v = 0;
    int any = 0;
    while (q < n) {
      if (s[q] == '_') {
        q++;
        continue;
      }
      int h = jinja_hexval(s[q]);
      if (h < 0 || h >= base)
        break;
      v = v * base + h;
      any = 1;
      q++;
    }
    if (any) {
      struct jinja_token *t = jinja_lex_push(lx, JINJA_TOK_INT);
      t->value = jinja_int(v);
      lx->pos = q;
      return;
    }
  }
  size_t q = jinja_scan_digits(s, n, p);
  int is_float = 0;
  size_t f = q;
  if (f < n && s[f] == '.' && f + 1 < n && jinja_is_digit(s[f + 1])) {
    f = jinja_scan_digits(s, n, f + 1);
    is_float = 1;
  }
  if (f < n && (s[f] == 'e' || s[f] == 'E')) {
    size_t e = f + 1;
    if (e < n && (s[e] == '+' || s[e] == '-'))
      e++;
    if (e < n && jinja_is_digit(s[e])) {
      f = jinja_scan_digits(s, n, e);
      is_float = 1;
    }
  }
  if (!is_float)
    f = q;
  char tmp[128];
  size_t k = 0;
  for (size_t i = p; i < f && k + 1 < sizeof tmp; i++)
    if (s[i] != '_')
      tmp[k++] = s[i];
  tmp[k] = 0;
  struct jinja_token *t = jinja_lex_push(lx, is_float ? JINJA_TOK_FLOAT : JINJA_TOK_INT);
  t->value = is_float ? jinja_float(strtod(tmp, NULL)) : jinja_int(strtoll(tmp, NULL, 10));
  lx->pos = f;
}

/* Tokens inside {{ }} or {% %} up to the closing delimiter (END is "}}" or "%}"), which only
 * counts outside brackets, as in Jinja2. */
static void jinja_lex_tag(struct jinja_lexer *lx, int is_block) {
  static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
  const char *s = lx->s;
  char close0 = is_block ? '%' : '}';
  int depth = 0;
  for (;;) {
    if (lx->pos >= lx->n)
      jinja_fail(lx->st, "unexpected end of template, expected '%s'", is_block ? "%}" : "}}");
    size_t p = lx->pos;
    lx->st->at = p;
    char c = s[p];
    if (depth == 0) {
      char sign = 0;
      size_t q = p;
      /* "-%}" / "+%}" / "-}}"; a variable has no "+}}" form (that is the + operator). */
      if ((c == '-' || (c == '+' && is_block)) && q + 2 < lx->n && s[q + 1] == close0 &&
          s[q + 2] == '}') {
        sign = c;
        q++;
      }
      if (q + 1 < lx->n && s[q] == close0 && s[q + 1] == '}') {
        jinja_lex_push(lx, is_block ? JINJA_TOK_BLOCK_END : JINJA_TOK_VAR_END);
        lx->pos = q + 2;
        if (is_block)
          jinja_lex_after_end(lx, sign, 1);
        else if (sign == '-')
          jinja_lex_after_end(lx, '-', 0);
        else
          lx->line_starting = 0;
        return;
      }
    }
    if (jinja_is_space(c)) {
      if (c == '\n')
        lx->line++;
      lx->pos++;
      continue;
    }
    if (jinja_is_digit(c)) {
      jinja_lex_number(lx);
      continue;
    }
    if (jinja_is_name_start(c)) {
      size_t q = p;
      while (q < lx->n && jinja_is_name_char(s[q]))
        q++;
      struct jinja_token *t = jinja_lex_push(lx, JINJA_TOK_NAME);
      t->text = jinja_str_n(lx->st, s + p, q - p).u.s->data;
      lx->pos = q;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t q = p + 1;
      while (q < lx->n && s[q] != c) {
        if (s[q] == '\\')
          q++;
        q++;
      }
      if (q >= lx->n)
        jinja_fail(lx->st, "unexpected char %s at %zu", c == '"' ? "'\"'" : "\"'\"", p);
      struct jinja_token *t = jinja_lex_push(lx, JINJA_TOK_STRING);
      t->value = jinja_unescape(lx, s + p + 1, q - p - 1);
      jinja_count_lines(lx, p, q);
      lx->pos = q + 1;
      continue;
    }
    const char *op = NULL;
    for (int i = 0; ops2[i]; i++)
      if (p + 1 < lx->n && s[p] == ops2[i][0] && s[p + 1] == ops2[i][1])
        op = ops2[i];
    char one[2] = {c, 0};
    if (!op) {
      if (!strchr("+-/*%~[](){}><=.:|,;", c))
        jinja_fail(lx->st, "unexpected char '%c' at %zu", c, p);
      op = one;
    }
    if (c == '(' || c == '[' || c == '{')
      depth++;
    else if (c == ')' || c == ']' || c == '}') {
      if (depth == 0)
        jinja_fail(lx->st, "unexpected '%c'", c);
      depth--;
    }
    struct jinja_token *t = jinja_lex_push(lx, JINJA_TOK_OP);
    t->text = jinja_str(lx->st, op).u.s->data;
    lx->pos += strlen(op);
  }
}

/* After "{%" (and its sign) at P: is this {% raw %}? Returns the position after its end. */
static size_t jinja_match_word_tag(const char *s, size_t n, size_t p, const char *word, char *end_sign) {
  while (p < n && jinja_is_space(s[p]))
    p++;
  size_t w = strlen(word);
  if (p + w > n || memcmp(s + p, word, w) != 0 || (p + w < n && jinja_is_name_char(s[p + w])))
    return 0;
  p += w;
  while (p < n && jinja_is_space(s[p]) && !(s[p] == '-' || s[p] == '+'))
    p++;
  *end_sign = 0;
  if (p < n && (s[p] == '-' || s[p] == '+')) {
    *end_sign = s[p];
    p++;
  }
  if (p + 1 < n && s[p] == '%' && s[p + 1] == '}')
    return p + 2;
  return 0;
}

static void jinja_lex_raw(struct jinja_lexer *lx, size_t body) {
  const char *s = lx->s;
  for (size_t p = body; p + 1 < lx->n; p++) {
    if (s[p] != '{' || s[p + 1] != '%')
      continue;
    size_t q = p + 2;
    char sign = 0;
    if (q < lx->n && (s[q] == '-' || s[q] == '+'))
      sign = s[q++];
    char end_sign;
    size_t after = jinja_match_word_tag(s, lx->n, q, "endraw", &end_sign);
    if (!after)
      continue;
    lx->line_starting = body > 0 && s[body - 1] == '\n';
    jinja_lex_text(lx, body, p, sign, 1);
    jinja_count_lines(lx, p, after);
    lx->pos = after;
    jinja_lex_after_end(lx, end_sign, 1);
    return;
  }
  jinja_fail(lx->st, "Missing end of raw directive");
}

struct jinja_token *jinja_lex(struct jinja_state *st, const char *src, size_t n, size_t *num_tokens) {
  /* Jinja2 reads \r\n and \r as \n and drops one trailing newline (keep_trailing_newline=False). */
  char *norm = jinja_alloc(st, n + 1);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (src[i] == '\r') {
      norm[m++] = '\n';
      if (i + 1 < n && src[i + 1] == '\n')
        i++;
    } else {
      norm[m++] = src[i];
    }
  }
  if (m > 0 && norm[m - 1] == '\n')
    m--;
  norm[m] = 0;

  struct jinja_lexer lx = {.st = st, .s = norm, .n = m, .line = 1, .line_starting = 1};
  st->src = norm;
  st->src_len = m;
  while (lx.pos < lx.n) {
    st->at = lx.pos;
    const char *s = lx.s;
    size_t p = lx.pos, open = 0;
    int kind = 0; /* '{', '%' or '#' */
    for (p = lx.pos; p + 1 < lx.n; p++)
      if (s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#')) {
        kind = s[p + 1];
        open = p;
        break;
      }
    if (!kind) {
      jinja_lex_text(&lx, lx.pos, lx.n, 0, 0);
      lx.pos = lx.n;
      break;
    }
    size_t q = open + 2;
    char sign = 0;
    if (q < lx.n && (s[q] == '-' || s[q] == '+'))
      sign = s[q++];
    if (kind == '%') {
      char end_sign;
      size_t after = jinja_match_word_tag(s, lx.n, q, "raw", &end_sign);
      if (after) {
        jinja_lex_text(&lx, lx.pos, open, sign, 1);
        jinja_count_lines(&lx, open, after);
        size_t body = after;
        if (end_sign == '-') /* {% raw -%} strips the start of the raw text; no trim_blocks */
          while (body < lx.n && jinja_is_space(s[body]))
            body++;
        jinja_count_lines(&lx, after, body);
        jinja_lex_raw(&lx, body);
        continue;
      }
    }
    jinja_lex_text(&lx, lx.pos, open, sign, kind != '{');
    lx.pos = q;
    if (kind == '#') {
      size_t e = q;
      while (e + 1 < lx.n && !(s[e] == '#' && s[e + 1] == '}'))
        e++;
      if (e + 1 >= lx.n)
        jinja_fail(st, "Missing end of comment tag");
      char esign = 0;
      if (e > q && (s[e - 1] == '-' || s[e - 1] == '+'))
        esign = s[e - 1];
      jinja_count_lines(&lx, q, e + 2);
      lx.pos = e + 2;
      jinja_lex_after_end(&lx, esign, 1);
      continue;
    }
    jinja_lex_push(&lx, kind == '%' ? JINJA_TOK_BLOCK_BEGIN : JINJA_TOK_VAR_BEGIN);
    jinja_lex_tag(&lx, kind == '%');
  }
  jinja_lex_push(&lx, JINJA_TOK_EOF);
  *num_tokens = lx.num_toks;
  return lx.toks;
}
