/* cli_run.c - `pagoda run`: one prompt (-p) or an interactive chat, streamed to stdout. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/engine_flags.h"
#include "pagoda.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pagoda run [-m MODEL] [-p PROMPT] [options]\n\n"
          "Generates text. With -p, prints only the generated text on stdout (logs and timings go to\n"
          "stderr); without -p, an interactive chat reading one user turn per line from stdin.\n\n"
          "  -p, --prompt TEXT             the prompt (a user turn when the model has a chat template)\n"
          "  --raw                         feed the prompt as is (BOS per tokenizer config), no template\n"
          "  --system TEXT                 system message for chat templates\n"
          "  -n, --max-tokens N            new tokens at most (default -1: until EOS or the context ends)\n"
          "  --temperature T               default 0.8; 0 = greedy\n"
          "  --top-k K                     default 0 (off)\n"
          "  --top-p P                     default 1 (off)\n"
          "  --min-p P                     default 0 (off)\n"
          "  --seed S                      default -1 (random)\n"
          "  --repetition-penalty R        default 1 (off)\n"
          "  --presence-penalty P          default 0\n"
          "  --frequency-penalty F         default 0\n"
          "  --stop STRING                 stop string (repeatable)\n"
          "  --ignore-eos                  keep generating after EOS\n\n");
  engine_flags_usage(f);
}

struct gen {
  struct timespec t0, t_first;
  int got_first;
  int n_out;
  enum pagoda_finish_reason finish;
  char *reply; /* chat: the assistant text (malloc'd) */
  size_t reply_len;
};

static double secs(struct timespec a, struct timespec b) {
  return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

/* Runs one request to the end, streaming text to stdout. Returns 0 or 1. */
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
  while (pagoda_engine_has_work(e)) {
    const struct pagoda_output *outs;
    int n;
    if (pagoda_engine_step(e, &outs, &n)) {
      fprintf(stderr, "error: %s\n", pagoda_last_error());
      return 1;
    }
    for (int i = 0; i < n; i++) {
      const struct pagoda_output *o = &outs[i];
      if (o->num_token_ids && !g->got_first) {
        g->got_first = 1;
        clock_gettime(CLOCK_MONOTONIC, &g->t_first);
      }
      g->n_out += o->num_token_ids;
      if (o->text_len) {
        fwrite(o->text, 1, o->text_len, stdout);
        fflush(stdout);
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
  fprintf(stderr, "\nprompt: %d tokens in %.3f s (%.1f tokens/s); generation: %d tokens in %.3f s (%.1f tokens/s)\n",
          n_ids, tp, tp > 0 ? n_ids / tp : 0.0, g->n_out, tg, tg > 0 && g->n_out > 1 ? (g->n_out - 1) / tg : 0.0);
  return 0;
}

/* Encodes PROMPT raw (BOS as configured, special-token text not parsed) or, for chat, the
 * rendered template (special tokens parsed; the template writes BOS itself). *IDS malloc'd. */
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

/* Renders MSGS with the template (or, without one, RAW_TRANSCRIPT) and runs one turn. */
static int chat_turn(pagoda_engine_t *e, cJSON *msgs, const struct pagoda_sampling_params *sp, struct gen *g) {
  char *js = cJSON_PrintUnformatted(msgs), *text = NULL;
  int rc = 1;
  if (!js)
    return 1;
  if (pagoda_render_chat(e, js, 1, &text)) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    free(js);
    return 1;
  }
  int32_t *ids = NULL;
  int n = encode(e, text, 1, &ids);
  if (n >= 0)
    rc = generate(e, ids, n, sp, g);
  free(ids);
  free(text);
  free(js);
  return rc;
}

int cli_run(int argc, char **argv) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.temperature = 0.8f;
  ep.max_num_seqs = 16; /* one prompt (or n samples): no need for 256 sequences of workspace */
  const char *prompt = NULL, *system = NULL, *v;
  const char *stops[16];
  int raw = 0, r;
  double d;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if ((r = engine_flags_parse(&ep, argc, argv, &i)) != 0) {
      if (r < 0)
        return 2;
      continue;
    }
#define TRY(name) if ((r = flag_value(name, argc, argv, &i, &v)) < 0) return 2; else if (r)
    if (!strcmp(a, "--raw")) {
      raw = 1;
    } else if (!strcmp(a, "--ignore-eos")) {
      sp.ignore_eos = 1;
    } else TRY("-p") prompt = v;
    else TRY("--prompt") prompt = v;
    else TRY("--system") system = v;
    else TRY("-n") { if (flag_int("-n", v, -1, 1 << 30, &sp.max_tokens) || !sp.max_tokens) return fprintf(stderr, "error: -n must be -1 or >= 1\n"), 2; }
    else TRY("--max-tokens") { if (flag_int("--max-tokens", v, -1, 1 << 30, &sp.max_tokens) || !sp.max_tokens) return fprintf(stderr, "error: --max-tokens must be -1 or >= 1\n"), 2; }
    else TRY("--temperature") { if (flag_double("--temperature", v, 0, 100, &d)) return 2; sp.temperature = (float)d; }
    else TRY("--temp") { if (flag_double("--temp", v, 0, 100, &d)) return 2; sp.temperature = (float)d; }
    else TRY("--top-k") { if (flag_int("--top-k", v, -1, 1 << 30, &sp.top_k)) return 2; }
    else TRY("--top-p") { if (flag_double("--top-p", v, 1e-9, 1, &d)) return 2; sp.top_p = (float)d; }
    else TRY("--min-p") { if (flag_double("--min-p", v, 0, 1, &d)) return 2; sp.min_p = (float)d; }
    else TRY("--seed") { long long s; if (flag_int64("--seed", v, -1, 0x7fffffffffffffffLL, &s)) return 2; sp.seed = s; }
    else TRY("--repetition-penalty") { if (flag_double("--repetition-penalty", v, 1e-6, 100, &d)) return 2; sp.repetition_penalty = (float)d; }
    else TRY("--presence-penalty") { if (flag_double("--presence-penalty", v, -100, 100, &d)) return 2; sp.presence_penalty = (float)d; }
    else TRY("--frequency-penalty") { if (flag_double("--frequency-penalty", v, -100, 100, &d)) return 2; sp.frequency_penalty = (float)d; }
    else TRY("--stop") {
      if (sp.n_stop == 16)
        return fprintf(stderr, "error: at most 16 --stop strings\n"), 2;
      stops[sp.n_stop++] = v;
    }
    else {
      fprintf(stderr, "error: unknown option '%s' (see pagoda run --help)\n", a);
      return 2;
    }
#undef TRY
  }
  sp.stop = stops;
  pagoda_engine_t *e;
  if (pagoda_engine_create(&ep, &e)) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    return 1;
  }
  int rc = 0;
  struct gen g;
  cJSON *msgs = cJSON_CreateArray();
  if (system)
    add_message(msgs, "system", system);
  int has_template = pagoda_has_chat_template(e);
  if (prompt) {
    if (raw || !has_template) {
      int32_t *ids = NULL;
      int n = encode(e, prompt, 0, &ids);
      rc = n < 0 ? 1 : generate(e, ids, n, &sp, &g);
      free(ids);
    } else {
      add_message(msgs, "user", prompt);
      rc = chat_turn(e, msgs, &sp, &g);
    }
    free(g.reply); /* stdout holds exactly the generated text: no newline added */
  } else {
    /* Interactive: one user turn per line; the whole conversation is re-rendered each turn (the
     * prefix cache keeps the earlier turns' KV, so only the new part is computed). */
    char *line = NULL, *transcript = NULL;
    size_t cap = 0, tlen = 0;
    fprintf(stderr, "chat: one message per line, Ctrl-D to end\n");
    while (!rc) {
      fprintf(stderr, "> ");
      ssize_t n = getline(&line, &cap, stdin);
      if (n < 0)
        break;
      if (n && line[n - 1] == '\n')
        line[--n] = 0;
      if (!n)
        continue;
      if (has_template && !raw) {
        add_message(msgs, "user", line);
        rc = chat_turn(e, msgs, &sp, &g);
        add_message(msgs, "assistant", g.reply ? g.reply : "");
      } else {
        char *t = realloc(transcript, tlen + (size_t)n + 2);
        if (!t)
          break;
        transcript = t;
        memcpy(transcript + tlen, line, (size_t)n);
        tlen += (size_t)n;
        transcript[tlen] = 0;
        int32_t *ids = NULL;
        int k = encode(e, transcript, 0, &ids);
        rc = k < 0 ? 1 : generate(e, ids, k, &sp, &g);
        free(ids);
        if (g.reply) {
          t = realloc(transcript, tlen + g.reply_len + 2);
          if (t) {
            transcript = t;
            memcpy(transcript + tlen, g.reply, g.reply_len);
            tlen += g.reply_len;
            transcript[tlen++] = '\n';
            transcript[tlen] = 0;
          }
        }
      }
      free(g.reply);
      fputc('\n', stdout);
      fflush(stdout);
    }
    free(line);
    free(transcript);
  }
  cJSON_Delete(msgs);
  pagoda_engine_free(e);
  return rc;
}
