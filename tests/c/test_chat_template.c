/* test_chat_template.c - the Jinja subset interpreter: every shared real template x context
 * against Jinja2's renderings (.out byte for byte, .err message), generated unit cases from
 * Jinja2, and the bounds that keep untrusted templates from hanging or exhausting memory. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "text/chat_template.h"
#include "text/jinja_render.h"

#include "chat_template_cases.h"

static char *render(const char *tmpl, const cJSON *ctx, size_t *len, char **err) {
  return chat_template_render(tmpl, ctx, len, err);
}

/* The message of a .err file: Jinja2's str(e) followed by one newline. */
static int check_shared_case(const char *tdir, const char *tname, const char *cname) {
  if (strlen(tdir) > 4000 || strlen(tname) > 255 || strlen(cname) > 255)
    return 0;
  char path[8192];
  snprintf(path, sizeof path, "%s/%s", tdir, tname);
  size_t tlen;
  char *tmpl = test_read_file(path, &tlen);
  snprintf(path, sizeof path, "%s/contexts/%s", tdir, cname);
  size_t clen;
  char *ctext = test_read_file(path, &clen);
  REQUIRE(tmpl && ctext, "read %s", path);
  cJSON *ctx = cJSON_ParseWithLength(ctext, clen);
  REQUIRE(ctx, "parse %s", path);
  char base[1024];
  snprintf(base, sizeof base, "%.*s__%.*s", (int)(strlen(tname) - 6), tname, (int)(strlen(cname) - 5),
           cname);
  size_t len = 0, exp_len = 0;
  char *err = NULL;
  char *out = render(tmpl, ctx, &len, &err);
  snprintf(path, sizeof path, "%s/expected/%s.out", tdir, base);
  char *expected = test_read_file(path, &exp_len);
  int ok = 1;
  if (expected) {
    CHECK(out != NULL, "%s: failed: %s", base, err ? err : "?");
    CHECK(out == NULL || (len == exp_len && memcmp(out, expected, len) == 0),
          "%s: rendering differs:\n%.*s", base, (int)len, out ? out : "");
    ok = out && len == exp_len && memcmp(out, expected, len) == 0;
  } else {
    snprintf(path, sizeof path, "%s/expected/%s.err", tdir, base);
    expected = test_read_file(path, &exp_len);
    CHECK(expected != NULL, "%s: no .out or .err", base);
    CHECK(out == NULL, "%s: rendered although Jinja2 raised", base);
    ok = expected && out == NULL && err && strlen(err) + 1 == exp_len &&
         memcmp(err, expected, exp_len - 1) == 0 && expected[exp_len - 1] == '\n';
    CHECK(ok, "%s: message '%s' differs from '%s'", base, err ? err : "", expected ? expected : "");
  }
  free(expected);
  free(out);
  free(err);
  cJSON_Delete(ctx);
  free(tmpl);
  free(ctext);
  return ok;
}

static int shared_suite(void) {
  const char *tdir = test_shared_path("templates");
  if (!tdir)
    return -1;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", tdir);
  char ctxdir[8192];
  snprintf(ctxdir, sizeof ctxdir, "%s/contexts", dir);
  int cases = 0;
  DIR *td = opendir(dir);
  REQUIRE(td, "open %s", dir);
  struct dirent *te;
  while ((te = readdir(td))) {
    size_t n = strlen(te->d_name);
    if (n < 7 || strcmp(te->d_name + n - 6, ".jinja") != 0)
      continue;
    DIR *cd = opendir(ctxdir);
    REQUIRE(cd, "open %s", ctxdir);
    struct dirent *ce;
    while ((ce = readdir(cd))) {
      size_t m = strlen(ce->d_name);
      if (m < 6 || strcmp(ce->d_name + m - 5, ".json") != 0)
        continue;
      check_shared_case(dir, te->d_name, ce->d_name);
      cases++;
    }
    closedir(cd);
  }
  closedir(td);
  CHECK(cases >= 24, "only %d shared cases found", cases);
  return cases;
}

static void generated_cases(void) {
  cJSON *ctx = cJSON_Parse(chat_template_context_json);
  CHECK(ctx != NULL, "context parses");
  for (size_t i = 0; i < sizeof chat_template_cases / sizeof chat_template_cases[0]; i++) {
    const struct chat_template_case *c = &chat_template_cases[i];
    size_t len = 0;
    char *err = NULL;
    char *out = render(c->template_src, ctx, &len, &err);
    if (c->output) {
      CHECK(out && len == strlen(c->output) && memcmp(out, c->output, len) == 0,
            "case %zu %s\n  want: %s\n  got:  %s (err %s)", i, c->template_src, c->output,
            out ? out : "(null)", err ? err : "");
    } else {
      CHECK(!out && err && strcmp(err, c->error) == 0, "case %zu %s\n  want error: %s\n  got: %s / %s",
            i, c->template_src, c->error, out ? out : "(null)", err ? err : "(none)");
    }
    free(out);
    free(err);
  }
  cJSON_Delete(ctx);
}

/* Renders under small limits and expects an error containing WANT. */
static void expect_bounded(const char *tmpl, const char *want) {
  const struct jinja_limits limits = {.max_steps = 200000, .max_output = 1 << 20};
  size_t len;
  char *err = NULL;
  char *out = jinja_render(tmpl, NULL, &limits, &len, &err);
  CHECK(out == NULL && err && strstr(err, want), "%.60s: want an error with '%s', got %s", tmpl, want,
        err ? err : "a rendering");
  free(out);
  free(err);
}

static void bounds(void) {
  expect_bounded("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 "steps");
  expect_bounded("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "output");
  expect_bounded(
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "limit");
  expect_bounded("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nesting");
  expect_bounded("{{ range(1000000) }}", "Range too big");
  /* One step must not hide unbounded work: scans of a big string inside a loop are charged. */
  expect_bounded(
      "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}",
      "steps");
  expect_bounded("{% set s = 'ab' * 500000 %}{% for i in range(100000) %}{{ s.count('b') }}{% endfor %}",
                 "steps");
  expect_bounded(
      "{% set l = range(100000) | list %}{% for i in range(100000) %}{{ -1 in l }}{% endfor %}",
      "steps");
  expect_bounded("{{ 'x' * 100000000 }}", "limit");
  expect_bounded("{{ [1] * 100000000 }}", "limit");
  char *deep = malloc(20010);
  memset(deep, '(', 10000);
  memcpy(deep + 10000, "1", 1);
  memset(deep + 10001, ')', 10000);
  deep[20001] = 0;
  char *tmpl = malloc(20020);
  snprintf(tmpl, 20020, "{{ %s }}", deep);
  expect_bounded(tmpl, "nesting");
  memset(deep, '[', 10000);
  memset(deep + 10000, ']', 10000);
  deep[20000] = 0;
  snprintf(tmpl, 20020, "{{ %s }}", deep);
  expect_bounded(tmpl, "nesting");
  /* A long else-if chain nests in the parser too. */
  char *chain = malloc(12 * 20000 + 16);
  size_t at = (size_t)sprintf(chain, "{{ 1");
  for (int i = 0; i < 20000; i++)
    at += (size_t)sprintf(chain + at, " if 1 else 1");
  sprintf(chain + at, " }}");
  expect_bounded(chain, "nesting");
  free(chain);
  free(deep);
  free(tmpl);
  /* The default limits are checked through the CLI by tests/py/test_render_template.py (a
   * 10-million-step run is too slow for the sanitizer build). */
}

/* A context with a 200000-key object and a 200000-item list renders in linear time. */
static void big_context(void) {
  cJSON *ctx = cJSON_CreateObject();
  cJSON *obj = cJSON_AddObjectToObject(ctx, "d");
  cJSON *arr = cJSON_AddArrayToObject(ctx, "l");
  char key[32];
  for (int i = 0; i < 200000; i++) {
    snprintf(key, sizeof key, "k%d", i);
    cJSON_AddNumberToObject(obj, key, i);
    cJSON_AddItemToArray(arr, cJSON_CreateNumber(i));
  }
  size_t len;
  char *err = NULL;
  char *out = chat_template_render("{{ d | length }} {{ l | length }} {{ d['k199999'] }} {{ l[-1] }}",
                                   ctx, &len, &err);
  CHECK(out && strcmp(out, "200000 200000 199999 199999") == 0, "big context: %s", out ? out : err);
  free(out);
  free(err);
  cJSON_Delete(ctx);
}

static void syntax_errors(void) {
  static const char *bad[] = {"{% if x %}open",
                              "{{ 1 +",
                              "{% for %}",
                              "{{ ) }}",
                              "{% endif %}",
                              "{# open",
                              "{{ 'unterminated }}",
                              "{% unknown_tag %}",
                              "{{ a | }}",
                              "{% raw %}never",
                              NULL};
  for (int i = 0; bad[i]; i++) {
    size_t len;
    char *err = NULL;
    char *out = chat_template_render(bad[i], NULL, &len, &err);
    CHECK(out == NULL && err && *err, "'%s' must fail with a message", bad[i]);
    free(out);
    free(err);
  }
}

/* Errors say where they are: line and column (code points, 1-based) of the offending token or
 * of the innermost expression being evaluated; the message itself stays Jinja2's. */
static void error_locations(void) {
  static const struct {
    const char *tmpl, *ctx, *msg;
    int line, col;
  } cases[] = {
      {"line1\n{{ x.y( }}", "{}", "unexpected '}'", 2, 10},
      {"a\r\n  {{ 1 +* 2 }}", "{}", "unexpected '*'", 2, 9},
      {"é{% if true %}\nü{{ 1 // 0 }}{% endif %}", "{}", "integer division or modulo by zero", 2, 5},
      {"{% for m in messages %}\n{{ m.content + 1 }}{% endfor %}", "{\"messages\": [{\"content\": \"x\"}]}",
       NULL, 2, 4},
      {"x\n\n  {{ raise_exception('Bad role') }}", "{}", "Bad role", 3, 6},
      {"{% if x %}never closed", "{}", NULL, 1, 23},
      {"{{ x }}", "[1]", "the template context must be a JSON object", 0, 0},
      {"ok\n{{ 'abc' | nofilter }}", "{}", NULL, 2, 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const struct jinja_limits limits = {.max_steps = 100000, .max_output = 1 << 20};
    cJSON *ctx = jinja_context_parse(cases[i].ctx, strlen(cases[i].ctx));
    size_t len;
    char *err = NULL;
    struct jinja_error_loc loc = {-1, -1};
    char *out = jinja_render_at(cases[i].tmpl, ctx, &limits, &len, &err, &loc);
    CHECK(!out && err, "case %zu must fail", i);
    CHECK(!cases[i].msg || (err && !strcmp(err, cases[i].msg)), "case %zu: message '%s'", i, err ? err : "");
    CHECK(loc.line == cases[i].line && loc.col == cases[i].col, "case %zu (%s): at %d:%d, expected %d:%d", i,
          err ? err : "", loc.line, loc.col, cases[i].line, cases[i].col);
    free(out);
    free(err);
    cJSON_Delete(ctx);
  }
}

int main(void) {
  error_locations();
  generated_cases();
  bounds();
  syntax_errors();
  big_context();
  int shared = shared_suite();
  int rc = test_finish("test_chat_template");
  if (shared < 0 && rc == 0)
    printf("(shared template suite skipped: no test data)\n");
  return rc;
}
