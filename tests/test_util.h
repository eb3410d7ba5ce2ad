/* test_util.h - tiny assertion and fixture helpers shared by the C tests. */
#ifndef PAGODA_TEST_UTIL_H
#define PAGODA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TEST_SKIP_CODE 77

extern int test_failures;

/* CHECK(cond, fmt, ...): records a failure with file:line and keeps going. */
#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                           \
      fputc('\n', stderr);                                                    \
      test_failures++;                                                        \
    }                                                                         \
  } while (0)

/* REQUIRE: like CHECK but returns 1 from the calling function on failure. */
#define REQUIRE(cond, ...)        \
  do {                            \
    int before_ = test_failures;  \
    CHECK(cond, __VA_ARGS__);     \
    if (test_failures != before_) \
      return 1;                   \
  } while (0)

/* Ends main: prints "N passed, M failed"-style summary of checks and returns the exit code. */
int test_finish(const char *name);

/* Prints why the test is skipped and returns TEST_SKIP_CODE (CTest counts it as skipped). */
int test_skip(const char *why);

/* $PAGODA_TESTDATA/rel, or NULL (after a message) when the shared test data is absent. */
const char *test_shared_path(const char *rel);
struct pagoda_engine_params;
/* The engine tests' starting point: stories260K (the shared test data) on the CPU, one thread, a
 * 16 MiB f32 cache, MAX_NUM_SEQS sequences of at most MAX_MODEL_LEN tokens, every other field at
 * its default. 0, or -1 (after a message) when the model is absent: the caller skips. */
int test_stories_params(struct pagoda_engine_params *p, int max_num_seqs, int max_model_len);
/* $PAGODA_FIXTURES/rel (tests/fixtures in the source tree). */
const char *test_fixture_path(const char *rel);

/* Reads a whole file; caller frees. NULL if it cannot be read. *len gets the size. */
char *test_read_file(const char *path, size_t *len);

/* Relative L2 error ||a - b|| / ||b|| in double precision. */
double test_rel_l2(const float *a, const float *b, size_t n);

/* "127.0.0.1:PORT" for a loopback port that was free a moment ago (bound to port 0 and released;
 * the rendezvous tests bind it again with SO_REUSEADDR). Exits on failure. */
void test_loopback_address(char *out, size_t cap);

/* Deterministic xorshift64* generator for property tests. */
uint64_t test_rand(uint64_t *state);
/* Uniform float in [-1, 1). */
float test_randf(uint64_t *state);

#endif
