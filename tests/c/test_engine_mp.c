/* test_engine_mp.c - multi-process tensor parallelism end to end on the CPU backend: real
 * processes (this binary re-executed as `--worker RANK WORLD MASTER MODEL`, or as `--rank0`)
 * joined through the rendezvous on loopback, the engine's model calls mirrored to the workers
 * and the all-reduce over the sockets (docs/distributed.md).
 *   - 2 processes (flags) and 4 processes (rank 0 from $PAGODA_TP_RANK / _WORLD / _MASTER) give
 *     the same tokens as single-process --tp 2 and --tp 1 for engine_runs.h's mix: greedy and
 *     seeded sampling, top-k / top-p, n = 2 (copy_blocks mirrored), prefix caching, mixed steps.
 *     Three processes cannot split stories260K (8 heads, 4 KV heads, ffn 172) nor any fixture
 *     (4 heads): 4 is the world above 2 that a real model here takes.
 *   - A worker killed mid-run: rank 0's next steps fail within 5 s naming rank 1; freeing the
 *     engine does not hang.
 *   - Rank 0 killed mid-run: its worker exits with an error naming rank 0 within 5 s.
 *   - A worker started with another --tp-world, or with another model, is refused at start on
 *     both sides with a message naming it; --tp with --tp-world, and an engine created as rank 1,
 *     are refused naming the flags.
 * Model: ../shared/testdata/models/stories260K.gguf; the other model: tests/fixtures/llama. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine_runs.h"

extern char **environ;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void base_params(struct pagoda_engine_params *p, const char *model) {
  pagoda_engine_params_default(p);
  p->model = model;
  p->device = "cpu";
  p->threads = 1;
  p->max_num_seqs = 16;
  p->max_model_len = 512;
  p->pa_memory_mb = 16;
  p->prefill_chunk_size = 32;
  p->max_num_batched_tokens = 69; /* mixed steps */
  p->cache_type = PAGODA_CACHE_TYPE_F32;
  p->tp = 1;
}

/* --worker RANK WORLD MASTER MODEL */
static int worker_main(char **argv) {
  struct pagoda_engine_params p;
  base_params(&p, argv[5]);
  p.tp_rank = atoi(argv[2]);
  p.tp_world = atoi(argv[3]);
  p.tp_master = argv[4];
  if (pagoda_tp_worker_run(&p) != PAGODA_OK) {
    fprintf(stderr, "worker error: %s\n", pagoda_last_error());
    return 3;
  }
  return 0;
}

/* --rank0 MASTER MODEL: rank 0 of 2 generating until it is killed. */
static int rank0_main(char **argv) {
  struct pagoda_engine_params p;
  base_params(&p, argv[3]);
  p.tp_rank = 0;
  p.tp_world = 2;
  p.tp_master = argv[2];
  pagoda_engine_t *e;
  if (pagoda_engine_create(&p, &e) != PAGODA_OK) {
    fprintf(stderr, "rank0 error: %s\n", pagoda_last_error());
    return 3;
  }
  for (;;) {
    if (!pagoda_engine_has_work(e)) {
      struct pagoda_sampling_params sp;
      sampling(0, &sp);
      uint64_t id;
      if (pagoda_add_request_tokens(e, prompts[1], prompt_len[1], &sp, &id) != PAGODA_OK) {
        fprintf(stderr, "rank0 error: %s\n", pagoda_last_error());
        return 3;
      }
    }
    const struct pagoda_output *outs;
    int n;
    if (pagoda_engine_step(e, &outs, &n) != PAGODA_OK) {
      fprintf(stderr, "rank0 error: %s\n", pagoda_last_error());
      return 3;
    }
  }
}

/* Starts this binary with ARGV; its stderr to LOG when given. */
static pid_t spawn(char *const argv[], const char *log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (log)
    posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ) != 0)
    pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

static pid_t spawn_worker(int rank, int world, const char *master, const char *model, const char *log) {
  char r[16], w[16];
  snprintf(r, sizeof r, "%d", rank);
  snprintf(w, sizeof w, "%d", world);
  char *argv[] = {"test_engine_mp", "--worker", r, w, (char *)master, (char *)model, NULL};
  return spawn(argv, log);
}

/* The exit status of PID (-1: still running after TIMEOUT_S, then killed; -2: a signal). */
static int wait_exit(pid_t pid, double timeout_s) {
  double end = now_s() + timeout_s;
  int status;
  for (;;) {
    pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    if (now_s() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static char master[64];

static void mp_params(struct pagoda_engine_params *p, const char *model, int world) {
  base_params(p, model);
  test_loopback_address(master, sizeof master);
  p->tp_rank = 0;
  p->tp_world = world;
  p->tp_master = master;
}

/* WORLD processes: rank 0 here (from the variables when ENV), workers spawned. */
static void mp_run(const char *what, const char *model, int world, int env, const struct result *ref1,
                   const struct result *ref2) {
  static struct result got;
  struct pagoda_engine_params p;
  struct pagoda_engine_stats st;
  mp_params(&p, model, world);
  pid_t pids[8];
  for (int r = 1; r < world; r++)
    pids[r] = spawn_worker(r, world, master, model, NULL);
  if (env) {
    setenv("PAGODA_TP_RANK", "0", 1);
    char w[16];
    snprintf(w, sizeof w, "%d", world);
    setenv("PAGODA_TP_WORLD", w, 1);
    setenv("PAGODA_TP_MASTER", master, 1);
    p.tp_rank = -1;
    p.tp_world = 0;
    p.tp_master = NULL;
  }
  double t0 = now_s();
  int rc = run(&p, 0, &got, &st);
  fprintf(stderr, "%s: %.2f s\n", what, now_s() - t0);
  unsetenv("PAGODA_TP_RANK");
  unsetenv("PAGODA_TP_WORLD");
  unsetenv("PAGODA_TP_MASTER");
  CHECK(rc == 0, "%s: the run failed", what);
  if (rc == 0) {
    char name[96];
    snprintf(name, sizeof name, "%s vs --tp 1", what);
    compare(name, ref1, &got);
    snprintf(name, sizeof name, "%s vs --tp 2", what);
    compare(name, ref2, &got);
  }
  for (int r = 1; r < world; r++) {
    int ec = wait_exit(pids[r], 10);
    CHECK(ec == 0, "%s: worker %d exited with %d after rank 0's engine was freed", what, r, ec);
  }
}

static int contains(const char *path, const char *needle) {
  size_t len;
  char *s = test_read_file(path, &len);
  int ok = s && strstr(s, needle);
  if (!ok)
    fprintf(stderr, "%s holds: %s\n", path, s ? s : "(nothing)");
  free(s);
  return ok;
}

/* Worker VICTIM of WORLD killed mid-run (IDLE: while rank 0 waits between steps, so that its
 * watchdog notices first): rank 0's next step fails within 5 s naming that rank. */
static int lost_worker(const char *model, int world, int victim, int idle) {
  struct pagoda_engine_params p;
  mp_params(&p, model, world);
  pid_t w[8];
  for (int r = 1; r < world; r++)
    w[r] = spawn_worker(r, world, master, model, "/dev/null");
  pagoda_engine_t *e;
  REQUIRE(pagoda_engine_create(&p, &e) == PAGODA_OK, "create: %s", pagoda_last_error());
  for (int r = 0; r < NREQ; r++) {
    struct pagoda_sampling_params sp;
    sampling(r, &sp);
    uint64_t id;
    REQUIRE(pagoda_add_request_tokens(e, prompts[r], prompt_len[r], &sp, &id) == PAGODA_OK, "add");
  }
  const struct pagoda_output *outs;
  int n, st = PAGODA_OK;
  for (int i = 0; i < 3; i++)
    REQUIRE(pagoda_engine_step(e, &outs, &n) == PAGODA_OK, "step %d: %s", i, pagoda_last_error());
  kill(w[victim], SIGKILL);
  double t0 = now_s();
  if (idle) {
    struct timespec ts = {0, 500 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  int steps = 0;
  while (now_s() - t0 < 10 && pagoda_engine_has_work(e) && (st = pagoda_engine_step(e, &outs, &n)) == PAGODA_OK)
    steps++;
  double dt = now_s() - t0;
  char err[1024], want[64];
  snprintf(err, sizeof err, "%s", pagoda_last_error());
  snprintf(want, sizeof want, idle ? "rank %d lost (its process exited" : "rank %d", victim);
  CHECK(st != PAGODA_OK, "a step failed after worker %d was killed (%d steps in %.2f s)", victim, steps, dt);
  CHECK(dt < 5, "... within 5 s: %.2f s", dt);
  CHECK(strstr(err, want), "the error names it (%s): %s", want, err);
  fprintf(stderr, "killed worker %d of %d%s: step failed after %.3f s (%d steps): %s\n", victim, world,
          idle ? " while idle" : "", dt, steps, err);
  t0 = now_s();
  st = pagoda_engine_step(e, &outs, &n);
  CHECK(st != PAGODA_OK && now_s() - t0 < 1, "the next step fails at once too (%d, %.2f s)", st, now_s() - t0);
  t0 = now_s();
  pagoda_engine_free(e);
  CHECK(now_s() - t0 < 2, "freeing the engine does not wait (%.2f s)", now_s() - t0);
  for (int r = 1; r < world; r++) {
    int ec = wait_exit(w[r], 5);
    CHECK(r == victim ? ec == -2 : ec == 3, "worker %d: %s (exit %d)", r,
          r == victim ? "killed" : "exits with an error once rank 0 stops the group", ec);
  }
  return 0;
}

/* Rank 0 killed mid-run: the worker exits with an error naming rank 0, within 5 s. */
static void lost_rank0(const char *model) {
  test_loopback_address(master, sizeof master);
  char log[] = "/tmp/test_engine_mp_XXXXXX";
  int fd = mkstemp(log);
  if (fd >= 0)
    close(fd);
  pid_t w = spawn_worker(1, 2, master, model, log);
  char *argv[] = {"test_engine_mp", "--rank0", master, (char *)model, NULL};
  pid_t r0 = spawn(argv, "/dev/null");
  struct timespec ts = {1, 0}; /* rank 0 is generating by then (its start takes ~0.1 s) */
  nanosleep(&ts, NULL);
  CHECK(waitpid(w, NULL, WNOHANG) == 0 && waitpid(r0, NULL, WNOHANG) == 0, "both ranks still running after 1 s");
  kill(r0, SIGKILL);
  double t0 = now_s();
  int ec = wait_exit(w, 10);
  double dt = now_s() - t0;
  CHECK(ec == 3, "the worker exits with an error when rank 0 dies (exit %d)", ec);
  CHECK(dt < 5, "... within 5 s: %.2f s", dt);
  CHECK(contains(log, "rank 0"), "its error names rank 0");
  fprintf(stderr, "killed rank 0: worker exited %d after %.3f s\n", ec, dt);
  wait_exit(r0, 5);
  unlink(log);
}

/* Rank 1 started with WORLD1 / MODEL1: rank 0's create fails naming NEEDLE, the worker exits. */
static void refused(const char *what, const char *model, int world1, const char *model1, const char *needle) {
  struct pagoda_engine_params p;
  mp_params(&p, model, 2);
  pid_t w = spawn_worker(1, world1, master, model1, "/dev/null");
  pagoda_engine_t *e = NULL;
  double t0 = now_s();
  int st = pagoda_engine_create(&p, &e);
  CHECK(st != PAGODA_OK && strstr(pagoda_last_error(), needle), "%s: refused naming '%s': %s", what, needle,
        pagoda_last_error());
  CHECK(now_s() - t0 < 5, "%s: refused at once (%.2f s)", what, now_s() - t0);
  if (st == PAGODA_OK)
    pagoda_engine_free(e);
  CHECK(wait_exit(w, 10) == 3, "%s: the worker exits with an error", what);
}

int main(int argc, char **argv) {
  alarm(300); /* a hang fails the test instead of blocking CTest */
  setenv("PAGODA_TP_TIMEOUT", "20", 1);
  make_prompts();
  if (argc == 6 && !strcmp(argv[1], "--worker"))
    return worker_main(argv);
  if (argc == 4 && !strcmp(argv[1], "--rank0"))
    return rank0_main(argv);
  const char *model = test_shared_path("models/stories260K.gguf");
  if (!model)
    return test_skip("stories260K.gguf not found");
  static struct result ref1, ref2;
  struct pagoda_engine_stats st;
  struct pagoda_engine_params p;
  base_params(&p, model);
  if (run(&p, 0, &ref1, &st))
    return test_finish("test_engine_mp");
  p.tp = 2;
  if (run(&p, 0, &ref2, &st))
    return test_finish("test_engine_mp");
  compare("--tp 2 vs --tp 1", &ref1, &ref2);

  mp_run("2 processes", model, 2, 0, &ref1, &ref2);
  mp_run("4 processes ($PAGODA_TP_*)", model, 4, 1, &ref1, &ref2);
  lost_worker(model, 2, 1, 0);
  lost_worker(model, 4, 2, 1);
  lost_rank0(model);
  refused("--tp-world 3 on rank 1", model, 3, model, "--tp-world 3");
  const char *other = test_fixture_path("llama");
  refused("another model on rank 1", model, 2, other, "another model");

  pagoda_engine_t *e = NULL;
  mp_params(&p, model, 2);
  p.tp = 2;
  CHECK(pagoda_engine_create(&p, &e) != PAGODA_OK && strstr(pagoda_last_error(), "--tp 2 with --tp-world 2"),
        "--tp 2 with --tp-world 2 refused: %s", pagoda_last_error());
  mp_params(&p, model, 2);
  p.tp_rank = 1;
  CHECK(pagoda_engine_create(&p, &e) != PAGODA_OK && strstr(pagoda_last_error(), "--tp-rank 1"),
        "an engine as rank 1 refused: %s", pagoda_last_error());
  mp_params(&p, model, 2);
  p.tp_master = NULL;
  CHECK(pagoda_engine_create(&p, &e) != PAGODA_OK && strstr(pagoda_last_error(), "--tp-master"),
        "--tp-world 2 without --tp-master refused: %s", pagoda_last_error());
  return test_finish("test_engine_mp");
}
