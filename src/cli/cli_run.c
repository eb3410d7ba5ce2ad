/* cli_run.c - `pagoda run`: one prompt (-p, -f) or an interactive chat, streamed to stdout.
 *
 * Ctrl-C (SIGINT) stops the reply being generated (the request is aborted, the timing line still
 * printed); in a chat the prompt comes back, and a Ctrl-C at the prompt, or a second one before
 * the reply has stopped, ends the program. A chat that outgrows the context drops its oldest
 * turns (the system message stays) with a note on stderr; a single message that cannot fit is
 * refused and the chat goes on. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_io.h"
#include "cli/engine_flags.h"
#include "pagoda.h"

static void usage(FILE *f, const struct pagoda_sampling_params *sp, const struct pagoda_engine_params *ep) {
  fprintf(f,
          "usage: pagoda run [-m MODEL] [-p PROMPT | -f FILE] [options]\n\n"
          "Generates text. With -p or -f, prints only the generated text on stdout (logs and timings go\n"
          "to stderr); without them, an interactive chat reading one user turn per line from stdin (a\n"
          "line ending in \\ continues on the next; a line \"\"\" opens and closes a multi-line message).\n"
          "Ctrl-C stops the reply; at the chat prompt it ends the chat.\n\n"
          "  -p, --prompt TEXT             the prompt (a user turn when the model has a chat template); - reads stdin\n"
          "  -f, --file FILE               the prompt is the content of FILE\n"
          "  --raw                         feed the prompt as is (BOS per tokenizer config), no template\n"
          "  --system TEXT                 system message for chat templates\n"
          "  -n, --max-tokens N            new tokens at most (default %d: until EOS or the context ends)\n"
          "  --temperature T, --temp T     default %g; 0 = greedy\n"
          "  --top-k K                     default %d (0: off)\n"
          "  --top-p P                     default %g (1: off)\n"
          "  --min-p P                     default %g (0: off)\n"
          "  --seed S                      default %lld (-1: random)\n"
          "  --repetition-penalty R        default %g (1: off)\n"
          "  --presence-penalty P          default %g\n"
          "  --frequency-penalty F         default %g\n"
          "  --stop STRING                 stop string (repeatable, up to 16)\n"
          "  --ignore-eos                  keep generating after EOS\n\n",
          sp->max_tokens, sp->temperature, sp->top_k, sp->top_p, sp->min_p, (long long)sp->seed,
          sp->repetition_penalty, sp->presence_penalty, sp->frequency_penalty);
  engine_flags_usage(f, ep);
}

/* SIGINT count since the last prompt; a second one while a reply is being stopped exits. */
static volatile sig_atomic_t g_sigint;

static void on_sigint(int sig) {
  (void)sig;
  if (++g_sigint >= 2) {
    static const char msg[] = "\ninterrupted\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(130);
  }
}

struct gen {
  struct timespec t0, t_first;
  int got_first;
  int num_out;
  int interrupted;  /* stopped by Ctrl-C */
  int write_failed; /* stdout could not be written */
  enum pagoda_finish_reason finish;
  char *reply; /* chat: the assistant text (malloc'd) */
  size_t reply_len;
};

static double secs(struct timespec a, struct timespec b) {
  return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

static void write_error(void) {
  fprintf(stderr, "error: cannot write the output to stdout: %s\n", strerror(errno ? errno : EIO));
}

/* Runs one request to the end (or to Ctrl-C), streaming text to stdout. Returns 0, or 1 after an
 * `error:` line (request rejected, forward pass failed, stdout not writable: G->write_failed). */
static int generate(pagoda_engine_t *e, const int32_t *ids, int n_ids, const struct pagoda_sampling_params *sp,
                    struct gen *g) {
  uint64_t id;
  memset(g, 0, sizeof *g);
  clock_gettime(CLOCK_MONOTONIC, &g->t0);
  int st = pagoda_add_request_tokens(e, ids, n_ids, sp, &id);
  if (st) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    return 1;
  }
  int rc = 0, aborted = 0;
  while (pagoda_engine_has_work(e)) {
    if (!aborted && (g_sigint || g->write_failed)) {
      g->interrupted = g_sigint > 0;
      pagoda_abort(e, id);
      aborted = 1;
    }
    const struct pagoda_output *outs;
    int n;
    if (pagoda_engine_step(e, &outs, &n)) {
      fprintf(stderr, "error: %s\n", pagoda_last_error());
      rc = 1;
      break;
    }
    for (int i = 0; i < n; i++) {
      const struct pagoda_output *o = &outs[i];
      if (o->num_token_ids && !g->got_first) {
        g->got_first = 1;
        clock_gettime(CLOCK_MONOTONIC, &g->t_first);
      }
      if (aborted)
        continue;
      g->num_out += o->num_token_ids;
      if (o->text_len) {
        if (!g->write_failed && (fwrite(o->text, 1, o->text_len, stdout) != o->text_len || fflush(stdout))) {
          write_error();
          g->write_failed = 1;
          rc = 1;
        }
        char *r = realloc(g->reply, g->reply_len + o->text_len + 1);
        if (r) {
          memcpy(r + g->reply_len, o->text, o->text_len);
          g->reply_len += o->text_len;
          r[g->reply_len] = 0;
          g->reply = r;
        }
      }
      if (o->finish_reason)
        g->finish = o->finish_reason;
    }
  }
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double tp = g->got_first ? secs(g->t0, g->t_first) : secs(g->t0, t1);
  double tg = g->got_first ? secs(g->t_first, t1) : 0;
  fprintf(stderr, "\n%sprompt: %d tokens in %.3f s (%.1f tokens/s); generation: %d tokens in %.3f s (%.1f tokens/s)\n",
          g->interrupted ? "interrupted; " : "", n_ids, tp, tp > 0 ? n_ids / tp : 0.0, g->num_out, tg,
          tg > 0 && g->num_out > 1 ? (g->num_out - 1) / tg : 0.0);
  return rc;
}

/* Encodes TEXT raw (BOS as configured, special-token text not parsed) or, for chat, the rendered
 * template (special tokens parsed; the template writes BOS itself). *IDS malloc'd. */
static int encode(pagoda_engine_t *e, const char *text, int chat, int32_t **ids) {
  size_t len = strlen(text);
  int n = pagoda_tokenize(e, text, len, !chat, chat, NULL, 0);
  if (n < 0) {
    fprintf(stderr, "error: cannot tokenize the prompt: %s\n", pagoda_last_error());
    return -1;
  }
  *ids = malloc((size_t)(n ? n : 1) * sizeof **ids);
  if (!*ids || pagoda_tokenize(e, text, len, !chat, chat, *ids, n) != n) {
    fprintf(stderr, "error: cannot tokenize the prompt\n");
    free(*ids);
    return -1;
  }
  return n;
}

static int add_message(cJSON *msgs, const char *role, const char *content) {
  cJSON *m = cJSON_CreateObject();
  if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content)) {
    cJSON_Delete(m);
    return -1;
  }
  cJSON_AddItemToArray(msgs, m);
  return 0;
}

/* The conversation as one prompt: the chat template's rendering, or (no template, --raw) the
 * messages concatenated, each reply followed by a newline. malloc'd, NULL after an error line. */
static char *render(pagoda_engine_t *e, cJSON *msgs, int templated) {
  if (templated) {
    char *js = cJSON_PrintUnformatted(msgs), *text = NULL;
    if (!js || pagoda_render_chat(e, js, 1, &text)) {
      fprintf(stderr, "error: %s\n", js ? pagoda_last_error() : "out of memory");
      text = NULL;
    }
    free(js);
    return text;
  }
  size_t len = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) len += strlen(cJSON_GetObjectItem(m, "content")->valuestring) + 1;
  char *text = malloc(len + 1), *p = text;
  if (!text) {
    fprintf(stderr, "error: out of memory\n");
    return NULL;
  }
  cJSON_ArrayForEach(m, msgs) {
    const char *role = cJSON_GetObjectItem(m, "role")->valuestring, *c = cJSON_GetObjectItem(m, "content")->valuestring;
    size_t n = strlen(c);
    memcpy(p, c, n);
    p += n;
    if (!strcmp(role, "assistant"))
      *p++ = '\n';
  }
  *p = 0;
  return text;
}

/* One chat turn: MSGS ends with the new user message. While the rendered conversation leaves no
 * room for the reply (sp->max_tokens, or with -1 a quarter of the context), the oldest
 * user/assistant pair after the system message is dropped, with a note. When the new message
 * alone does not fit, it is taken out of MSGS and the turn refused (1). On success the reply is
 * appended to MSGS. Returns 0, or 1 after an error line; G->write_failed ends the chat. */
static int chat_turn(pagoda_engine_t *e, cJSON *msgs, int templated, int first, const struct pagoda_sampling_params *sp,
                     struct gen *g) {
  const int max_len = pagoda_max_model_len(e);
  int room = sp->max_tokens > 0 ? sp->max_tokens : max_len / 4 > 0 ? max_len / 4 : 1;
  int dropped = 0;
  memset(g, 0, sizeof *g);
  for (;;) {
    char *text = render(e, msgs, templated);
    int32_t *ids = NULL;
    int n = text ? encode(e, text, templated, &ids) : -1;
    free(text);
    if (n < 0) {
      cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
      return 1;
    }
    int turns = cJSON_GetArraySize(msgs) - first; /* messages after the system one */
    if (n + room > max_len && turns > 1) {
      cJSON_DeleteItemFromArray(msgs, first); /* the oldest user message and its reply */
      if (cJSON_GetArraySize(msgs) - first > 1)
        cJSON_DeleteItemFromArray(msgs, first);
      dropped++;
      free(ids);
      continue;
    }
    if (dropped)
      fprintf(stderr, "note: the conversation outgrew the context (%d tokens): dropped the %d oldest turn%s\n",
              max_len, dropped, dropped > 1 ? "s" : "");
    int rc;
    if (n + (sp->max_tokens > 0 ? sp->max_tokens : 1) > max_len) {
      fprintf(stderr,
              "error: this message needs %d tokens%s, more than the context of %d (--max-model-len): not sent\n", n,
              sp->max_tokens > 0 ? " plus -n" : "", max_len);
      rc = 1;
    } else {
      rc = generate(e, ids, n, sp, g);
    }
    free(ids);
    if (rc && !g->write_failed)
      cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
    else
      add_message(msgs, "assistant", g->reply ? g->reply : "");
    return rc;
  }
}

/* Reads one chat message into *BUF: a line; a line ending in '\' continues on the next line (the
 * backslash becomes a newline); a line that is exactly """ opens a block closed by the next such
 * line. Returns its length, -1 at the end of input, -2 when a Ctrl-C came. */
static ssize_t read_message(char **buf, size_t *cap, char **line, size_t *lcap) {
  size_t len = 0;
  int block = 0, cont = 0;
  if (!*buf && !(*buf = malloc(*cap = 256)))
    return -1;
  (*buf)[0] = 0;
  for (;;) {
    errno = 0;
    ssize_t n = getline(line, lcap, stdin);
    if (n < 0) {
      if (errno == EINTR || g_sigint) {
        clearerr(stdin);
        return -2;
      }
      return (block || cont) && len ? (ssize_t)len : -1;
    }
    if (n && (*line)[n - 1] == '\n')
      (*line)[--n] = 0;
    if (!block && !cont && !strcmp(*line, "\"\"\"")) {
      block = 1;
      continue;
    }
    if (block && !strcmp(*line, "\"\"\"")) {
      if (len && (*buf)[len - 1] == '\n')
        (*buf)[--len] = 0;
      return (ssize_t)len;
    }
    cont = !block && n && (*line)[n - 1] == '\\';
    if (cont)
      (*line)[n - 1] = '\n';
    if (len + (size_t)n + 2 > *cap) {
      size_t nc = (*cap + (size_t)n + 2) * 2;
      char *b = realloc(*buf, nc);
      if (!b)
        return -1;
      *buf = b;
      *cap = nc;
    }
    memcpy(*buf + len, *line, (size_t)n);
    len += (size_t)n;
    if (block)
      (*buf)[len++] = '\n';
    (*buf)[len] = 0;
    if (!block && !cont)
      return (ssize_t)len;
  }
}

static int chat(pagoda_engine_t *e, cJSON *msgs, int templated, const struct pagoda_sampling_params *sp) {
  char *line = NULL, *msg = NULL;
  size_t lcap = 0, mcap = 0;
  int first = cJSON_GetArraySize(msgs), rc = 0;
  fprintf(stderr, "chat: one message per line (end a line with \\ to go on, or put it between lines \"\"\"); "
                  "Ctrl-C stops a reply; Ctrl-D or Ctrl-C at the prompt ends\n");
  for (;;) {
    g_sigint = 0;
    fprintf(stderr, "> ");
    ssize_t n = read_message(&msg, &mcap, &line, &lcap);
    if (n == -2) { /* Ctrl-C at the prompt */
      fputc('\n', stderr);
      break;
    }
    if (n < 0)
      break;
    if (!n)
      continue;
    struct gen g;
    if (add_message(msgs, "user", msg)) {
      fprintf(stderr, "error: out of memory\n");
      rc = 1;
      break;
    }
    chat_turn(e, msgs, templated, first, sp, &g);
    free(g.reply);
    if (g.write_failed) {
      rc = 1;
      break;
    }
    fputc('\n', stdout);
    if (fflush(stdout)) {
      write_error();
      rc = 1;
      break;
    }
  }
  free(line);
  free(msg);
  return rc;
}

int cli_run(int argc, char **argv) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.temperature = 0.8f;
  ep.max_num_seqs = 16; /* one prompt (or n samples): no need for 256 sequences of workspace */
  const char *prompt = NULL, *file = NULL, *system = NULL, *v;
  const char *stops[16];
  int raw = 0, r;
  double d;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout, &sp, &ep);
      return 0;
    }
    if ((r = engine_flags_parse(&ep, argc, argv, &i)) != 0) {
      if (r < 0)
        return 2;
      continue;
    }
    if (!strcmp(a, "--raw")) {
      raw = 1;
    } else if (!strcmp(a, "--ignore-eos")) {
      sp.ignore_eos = 1;
    } else ON_FLAG("-p", &i, 2) prompt = v;
    else ON_FLAG("--prompt", &i, 2) prompt = v;
    else ON_FLAG("-f", &i, 2) file = v;
    else ON_FLAG("--file", &i, 2) file = v;
    else ON_FLAG("--system", &i, 2) system = v;
    else ON_FLAG("-n", &i, 2) {
      if (flag_int("-n", v, -1, 1 << 30, &sp.max_tokens)) /* it printed the error */
        return 2;
      if (!sp.max_tokens)
        return fprintf(stderr, "error: -n must be -1 or >= 1\n"), 2;
    }
    else ON_FLAG("--max-tokens", &i, 2) {
      if (flag_int("--max-tokens", v, -1, 1 << 30, &sp.max_tokens)) /* it printed the error */
        return 2;
      if (!sp.max_tokens)
        return fprintf(stderr, "error: --max-tokens must be -1 or >= 1\n"), 2;
    }
    else ON_FLAG("--temperature", &i, 2) { if (flag_double("--temperature", v, 0, 100, &d)) return 2; sp.temperature = (float)d; }
    else ON_FLAG("--temp", &i, 2) { if (flag_double("--temp", v, 0, 100, &d)) return 2; sp.temperature = (float)d; }
    else ON_FLAG("--top-k", &i, 2) { if (flag_int("--top-k", v, -1, 1 << 30, &sp.top_k)) return 2; }
    else ON_FLAG("--top-p", &i, 2) { if (flag_double("--top-p", v, 1e-9, 1, &d)) return 2; sp.top_p = (float)d; }
    else ON_FLAG("--min-p", &i, 2) { if (flag_double("--min-p", v, 0, 1, &d)) return 2; sp.min_p = (float)d; }
    else ON_FLAG("--seed", &i, 2) { long long s; if (flag_int64("--seed", v, -1, 0x7fffffffffffffffLL, &s)) return 2; sp.seed = s; }
    else ON_FLAG("--repetition-penalty", &i, 2) { if (flag_double("--repetition-penalty", v, 1e-6, 100, &d)) return 2; sp.repetition_penalty = (float)d; }
    else ON_FLAG("--presence-penalty", &i, 2) { if (flag_double("--presence-penalty", v, -100, 100, &d)) return 2; sp.presence_penalty = (float)d; }
    else ON_FLAG("--frequency-penalty", &i, 2) { if (flag_double("--frequency-penalty", v, -100, 100, &d)) return 2; sp.frequency_penalty = (float)d; }
    else ON_FLAG("--stop", &i, 2) {
      if (sp.n_stop == 16)
        return fprintf(stderr, "error: at most 16 --stop strings\n"), 2;
      stops[sp.n_stop++] = v;
    }
    else {
      fprintf(stderr, "error: unknown option '%s' (see pagoda run --help)\n", a);
      return 2;
    }
  }
  sp.stop = stops;
  if (prompt && file) {
    fprintf(stderr, "error: -p and -f both give the prompt: use one\n");
    return 2;
  }
  if (engine_flags_check(&ep))
    return 2;
  int worker_rc; /* --tp-rank > 0: this process serves rank 0's model calls instead */
  if (cli_tp_worker(&ep, &worker_rc))
    return worker_rc;
  char *owned = NULL; /* the prompt read from stdin or FILE */
  if (file || (prompt && !strcmp(prompt, "-"))) {
    size_t len;
    owned = file ? cli_read_file(file, &len) : cli_read_stdin(&len);
    if (!owned) {
      fprintf(stderr, "error: cannot read the prompt from %s: %s\n", file ? file : "stdin", strerror(errno));
      return 1;
    }
    if (strlen(owned) != len) {
      fprintf(stderr, "error: the prompt in %s contains a NUL byte\n", file ? file : "stdin");
      free(owned);
      return 1;
    }
    prompt = owned;
  }
  pagoda_engine_t *e;
  if (pagoda_engine_create(&ep, &e)) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    free(owned);
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint; /* no SA_RESTART: a Ctrl-C at the prompt interrupts the read */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  int rc = 0, templated = pagoda_has_chat_template(e) && !raw;
  if (system && !templated)
    fprintf(stderr, "note: --system ignored: %s\n",
            raw ? "--raw sends the prompt as is" : "the model has no chat template");
  struct gen g;
  memset(&g, 0, sizeof g);
  cJSON *msgs = cJSON_CreateArray();
  if (!msgs || (system && add_message(msgs, "system", system))) {
    fprintf(stderr, "error: out of memory\n");
    rc = 1;
  } else if (prompt) {
    int32_t *ids = NULL;
    if (!templated) {
      int n = encode(e, prompt, 0, &ids);
      rc = n < 0 ? 1 : generate(e, ids, n, &sp, &g);
    } else {
      char *text = add_message(msgs, "user", prompt) ? NULL : render(e, msgs, 1);
      int n = text ? encode(e, text, 1, &ids) : -1;
      rc = n < 0 ? 1 : generate(e, ids, n, &sp, &g);
      free(text);
    }
    free(ids);
    if (!rc && g.interrupted)
      rc = 130;
    free(g.reply); /* stdout holds exactly the generated text: no newline added */
  } else {
    /* Interactive: the whole conversation is re-rendered each turn (the prefix cache keeps the
     * earlier turns' KV, so only the new part is computed). */
    rc = chat(e, msgs, templated, &sp);
  }
  cJSON_Delete(msgs);
  pagoda_engine_free(e);
  free(owned);
  return rc;
}
