/* engine_flags.h - the engine options shared by `pagoda run`, `bench` (and later `serve`). */
#ifndef PAGODA_ENGINE_FLAGS_H
#define PAGODA_ENGINE_FLAGS_H

#include <stdio.h>

#include "pagoda.h"

/* If argv[*i] is an engine flag (-m/--model, --device, --threads, --paged-attn, --pa-*,
 * --prefix-cache-n, --max-num-seqs, --max-num-batched-tokens, --prefill-chunk-size,
 * --max-model-len; "--flag value" or "--flag=value"), stores it in P, advances *i past its value
 * and returns 1; returns 0 when it is not one, -1 after printing a message for a bad value. */
int engine_flags_parse(struct pagoda_engine_params *p, int argc, char **argv, int *i);
/* Usage of the engine flags; the defaults printed are D's, the values the command starts its
 * parse from, so --help and the parser cannot disagree. */
void engine_flags_usage(FILE *f, const struct pagoda_engine_params *d);
/* After parsing: -1 with an `error:` line for flags that exclude each other (a usage error). */
int engine_flags_check(const struct pagoda_engine_params *p);

/* Multi-process tensor parallelism (cli_worker.c): after parsing, a process whose rank
 * (--tp-rank, else $PAGODA_TP_RANK) is above 0 runs rank 0's model calls instead of the command
 * (pagoda_tp_worker_run). Returns 1 with *RC the exit status when it did (or the parameters are
 * invalid: `error:` printed, *RC 2), 0 for rank 0 or a single process (the command runs). */
int cli_tp_worker(const struct pagoda_engine_params *p, int *rc);

/* Helpers for the subcommands' own flags: flag NAME at argv[*i] with its value (either form).
 * Return 1 and set *VALUE when argv[*i] is NAME, 0 when not, -1 (message printed) when the value
 * is missing. */
int flag_value(const char *name, int argc, char **argv, int *i, const char **value);
/* ON_FLAG(NAME, IP, FAIL) { ... }: the block runs with the value in V when argv[*IP] is flag NAME;
 * when its value is missing (message printed) the enclosing function returns FAIL. Uses the
 * caller's argc, argv and `int r; const char *v;`. */
#define ON_FLAG(name, ip, fail) if ((r = flag_value(name, argc, argv, ip, &v)) < 0) return fail; else if (r)
/* Strict conversions; -1 with a message naming FLAG on a malformed or out-of-range value. */
int flag_int(const char *flag, const char *s, long lo, long hi, int *out);
int flag_int64(const char *flag, const char *s, long long lo, long long hi, long long *out);
int flag_double(const char *flag, const char *s, double lo, double hi, double *out);

#endif
