/* jinja_value.h - values of the chat-template interpreter, the per-render arena that owns them,
 * and the error unwinding shared by the lexer, parser and evaluator. */
#ifndef PAGODA_JINJA_VALUE_H
#define PAGODA_JINJA_VALUE_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

/* Limits that keep untrusted templates bounded (see docs/chat-templates.md). */
#define JINJA_MAX_STEPS 10000000L           /* expression and statement evaluations per render */
#define JINJA_MAX_OUTPUT (16u << 20)        /* bytes of rendered text, and of any one string */
#define JINJA_MAX_ARENA ((size_t)256 << 20) /* bytes of values and syntax tree per render */
#define JINJA_MAX_DEPTH 400                 /* nesting of parsing, evaluation and macro calls */

enum jinja_type {
  JINJA_UNDEFINED,
  JINJA_NONE,
  JINJA_BOOL,
  JINJA_INT,
  JINJA_FLOAT,
  JINJA_STRING,
  JINJA_LIST, /* also tuples (jinja_list.is_tuple) */
  JINJA_DICT,
  JINJA_NAMESPACE, /* a dict whose attributes {% set ns.x = ... %} may change */
  JINJA_CALLABLE,
  JINJA_LOOP, /* the `loop` variable of a for block */
};

struct jinja_str;
struct jinja_list;
struct jinja_dict;
struct jinja_callable;
struct jinja_loop;

struct jinja_value {
  enum jinja_type type;
  /* For strings: a markupsafe.Markup (from |safe or |escape). Jinja2 keeps such strings apart:
   * Markup + str HTML-escapes the str, which real templates (functionary) depend on. */
  int markup;
  union {
    int b;
    int64_t i;
    double f;
    struct jinja_str *s;
    struct jinja_list *l;
    struct jinja_dict *d;
    struct jinja_callable *c;
    struct jinja_loop *loop;
    /* For JINJA_UNDEFINED: why it is undefined, raised when it is used (NULL: silent). */
    const char *why;
  } u;
};

struct jinja_str {
  size_t len;
  char data[]; /* (len + 1) UTF-8 bytes, NUL-terminated */
};

struct jinja_list {
  size_t n;
  int is_tuple;
  int view;                  /* 0, or the dict view this list stands for (d.keys() etc.): JINJA_VIEW_* */
  struct jinja_value *items; /* (n) */
};

/* JINJA_VIEW_GENERATOR: the result of map/select/reject/selectattr/rejectattr, a generator in
 * Jinja2: it prints and iterates as its list, but tojson and subscripts refuse it as Python
 * does (it is not re-run lazily, so a second iteration still sees the items). */
enum { JINJA_VIEW_KEYS = 1, JINJA_VIEW_VALUES, JINJA_VIEW_ITEMS, JINJA_VIEW_GENERATOR };

struct jinja_dict {
  size_t n, cap;
  struct jinja_value *keys; /* (cap) insertion order, like Python dicts */
  struct jinja_value *vals; /* (cap) */
};

/* The state behind a for block's `loop` variable. */
struct jinja_loop {
  size_t index0, length;
  const struct jinja_value *items; /* (length) the filtered sequence being iterated */
  int depth;
  struct jinja_value last_changed; /* argument of the previous loop.changed() call */
  int changed_called;
  /* The for node and the frame it runs in: loop(items) of a `recursive` loop runs the node
   * again over ITEMS in that frame, one level deeper, and returns what it renders. */
  const struct jinja_node *node;
  struct jinja_frame *outer;
};

/* One block of arena memory; chunks form a singly linked list freed at the end of a render. */
struct jinja_chunk {
  struct jinja_chunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};

/* State of one render: arena, limits and where errors unwind to. Every allocation of a render
 * comes from the arena, so an error can longjmp out of any depth without leaking. */
struct jinja_state {
  struct jinja_chunk *chunks;
  size_t arena_bytes;
  long steps;
  long max_steps; /* JINJA_MAX_STEPS unless a caller asks for less */
  int depth;
  char *err;        /* malloc'd message after an error */
  jmp_buf on_error; /* set by the entry point; jinja_fail jumps here */
  /* Where errors are: SRC (SRC_LEN bytes) is the template as lexed, AT the byte offset of the
   * construct being lexed, parsed or evaluated (SIZE_MAX: none, e.g. the context). jinja_fail
   * turns AT into ERR_LINE and ERR_COL (1-based; column in code points; 0 when unknown). */
  const char *src;
  size_t src_len, at;
  int err_line, err_col;
};

void *jinja_alloc(struct jinja_state *st, size_t size);
/* Releases all arena memory (not err). */
void jinja_state_release(struct jinja_state *st);
/* Records the message and unwinds to st->on_error. */
_Noreturn void jinja_fail(struct jinja_state *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Same with a message taken whole (raise_exception texts may be long). */
_Noreturn void jinja_fail_msg(struct jinja_state *st, const char *msg);
/* Counts one evaluation step against st->max_steps. */
void jinja_step(struct jinja_state *st);
/* Charges WORK units (bytes scanned or copied; list items count 16) as WORK/64 steps, so that
 * one step cannot hide unbounded work (a substring test on a 16 MiB string inside a loop). */
void jinja_charge(struct jinja_state *st, size_t work);

/* A growable byte buffer in malloc'd memory (the output) or in the arena (temporaries). */
struct jinja_buf {
  struct jinja_state *st;
  char *data; /* (cap) */
  size_t len, cap;
  size_t limit; /* fails beyond this many bytes */
  int heap;     /* 1: malloc'd (caller frees data), 0: arena */
};
void jinja_buf_init(struct jinja_buf *b, struct jinja_state *st, int heap, size_t limit);
void jinja_buf_add(struct jinja_buf *b, const char *s, size_t n);
void jinja_buf_adds(struct jinja_buf *b, const char *s);
void jinja_buf_addf(struct jinja_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The contents as an arena string. */
struct jinja_value jinja_buf_value(struct jinja_buf *b);

/* Constructors. */
struct jinja_value jinja_undefined(const char *why);
struct jinja_value jinja_none(void);
struct jinja_value jinja_bool(int b);
struct jinja_value jinja_int(int64_t i);
struct jinja_value jinja_float(double f);
struct jinja_value jinja_str_n(struct jinja_state *st, const char *s, size_t n);
struct jinja_value jinja_str(struct jinja_state *st, const char *s);
struct jinja_value jinja_list_new(struct jinja_state *st, size_t n, int is_tuple);
/* A list holding copies of ITEMS (n). */
struct jinja_value jinja_list_from(struct jinja_state *st, const struct jinja_value *items, size_t n);
struct jinja_value jinja_dict_new(struct jinja_state *st);
/* Sets KEY (replacing an equal key in place, else appending). */
void jinja_dict_set(struct jinja_state *st, struct jinja_dict *d, struct jinja_value key,
                    struct jinja_value val);
/* Appends KEY without looking for an equal one (the caller knows keys are distinct or accepts
 * that lookups find the first). */
void jinja_dict_append(struct jinja_state *st, struct jinja_dict *d, struct jinja_value key,
                       struct jinja_value val);
/* The value of KEY or NULL. */
struct jinja_value *jinja_dict_get(struct jinja_dict *d, struct jinja_value key);
struct jinja_value *jinja_dict_gets(struct jinja_dict *d, const char *key);

/* Python semantics. */
int jinja_truthy(struct jinja_value v);
int jinja_equal(struct jinja_value a, struct jinja_value b);
/* <0, 0, >0; fails on values Python cannot order. */
int jinja_compare(struct jinja_state *st, struct jinja_value a, struct jinja_value b);
int jinja_is_number(struct jinja_value v); /* int, float or bool */
double jinja_as_double(struct jinja_value v);
/* Python's type name as Jinja2's error messages write it ("dict", "str", "NoneType", ...). */
const char *jinja_type_name(struct jinja_value v);

/* Fails with Jinja2's UndefinedError message when V is an undefined that carries one. */
void jinja_check_defined(struct jinja_state *st, struct jinja_value v);

/* str(v) and repr(v) appended to B; jinja_to_str returns str(v) as a string value. */
void jinja_write_str(struct jinja_buf *b, struct jinja_value v);
void jinja_write_repr(struct jinja_buf *b, struct jinja_value v);
struct jinja_value jinja_to_str(struct jinja_state *st, struct jinja_value v);
/* Python's repr of a float ("1.0", "1e-05", "inf"). */
void jinja_write_float(struct jinja_buf *b, double f);

/* json.dumps(v, ensure_ascii=False, indent=INDENT (NULL: none), separators, sort_keys). */
void jinja_write_json(struct jinja_buf *b, struct jinja_value v, const char *indent,
                      const char *item_sep, const char *key_sep, int sort_keys);

/* UTF-8 helpers: code point count, and the byte offset of code point I (clamped). */
size_t jinja_utf8_len(const char *s, size_t n);
size_t jinja_utf8_offset(const char *s, size_t n, size_t i);

#endif
