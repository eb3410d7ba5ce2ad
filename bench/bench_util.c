/* bench_util.c - clock and copy-bandwidth ceiling for the C benchmarks. */
#include "bench_util.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double bench_copy_gbps(int threads, double secs) {
  size_t bytes = (size_t)512 << 20;
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) {
    free(a);
    free(b);
    return 0;
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  int reps = 0;
  double t0 = bench_now(), t;
  do {
#pragma omp parallel num_threads(threads)
    {
      int n = omp_get_num_threads(), i = omp_get_thread_num();
      size_t part = bytes / (size_t)n;
      memcpy(b + part * (size_t)i, a + part * (size_t)i, part);
    }
    reps++;
    t = bench_now() - t0;
  } while (t < secs);
  free(a);
  free(b);
  return 2.0 * (double)bytes * reps / t / 1e9;
}
