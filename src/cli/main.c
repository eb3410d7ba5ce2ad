/* main.c - the pagoda command: dispatches to one subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "pagoda.h"

/* OpenMP threads that finish a parallel op early spin (busy-wait) for the next one, 300000 spins
 * by default: on a machine whose cores are busy with other processes the spinning threads take
 * the time the working ones need. libgomp reads GOMP_SPINCOUNT once, in its initializer, before
 * main() runs (and libc's initializer discards a setenv made any earlier), so when neither it nor
 * OMP_WAIT_POLICY is set, the command sets a short spin (about 10 us, then a futex sleep) and
 * executes itself again. Returns only when no re-execution happened. */
#define PAGODA_OMP_SPINCOUNT "10000"
static void set_omp_wait_policy(char **argv) {
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
    return;
  if (setenv("GOMP_SPINCOUNT", PAGODA_OMP_SPINCOUNT, 1))
    return;
  execv("/proc/self/exe", argv); /* on failure: go on with the default policy */
}

/* CUDA loads a kernel on its first launch by default (lazy loading). The backend then loads its own
 * kernels on a background thread during the weights' upload (cuda_preload.cu), but cuBLAS's still
 * load mid-run, the first time a batch meets a new GEMM shape: 1-2 s runs of 64-256 parallel
 * requests on the 1B shape ran at 0.93-1.01x the throughput of eager loading (median 0.99x) and a
 * first 16-token prompt 10-13 ms later (bench/RESULTS.md, session 20). So the command asks for eager
 * loading, all kernels when the CUDA context is created (1.7-4.5 s more start-up, about 0.4 GiB less
 * KV pool per GPU), unless CUDA_MODULE_LOADING is set (LAZY keeps CUDA's default). CUDA reads the
 * variable when it starts, which is later than this, in the backend module. Set here and not in
 * the library: a library must not change its host process's environment (another thread may read
 * it; it would reach torch and child processes). */
static void set_cuda_module_loading(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help;
};

static const struct command commands[] = {
    {"run", cli_run, "generate text from a model (interactive chat without -p)"},
    {"bench", cli_bench, "offline throughput benchmark"},
    {"perplexity", cli_perplexity, "perplexity of a model on a text file (as llama-perplexity)"},
    {"tokenize", cli_tokenize, "text on stdin -> token ids on stdout"},
    {"detokenize", cli_detokenize, "token ids on stdin -> text on stdout"},
    {"render-template", cli_render_template, "render a chat template with a JSON context"},
    {"serve", cli_serve, "OpenAI-compatible HTTP server (docs/http.md)"},
};

static void usage(FILE *f) {
  fprintf(f, "pagoda %s - LLM inference built around PagedAttention\n\nusage: pagoda COMMAND [options]\n\n",
          PAGODA_VERSION);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\n'pagoda COMMAND --help' lists a command's options.\n");
}

int main(int argc, char **argv) {
  set_omp_wait_policy(argv);
  set_cuda_module_loading();
  if (argc < 2) {
    fprintf(stderr, "error: no command given\n\n");
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("pagoda %s\n", PAGODA_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name))
      return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "error: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
