/* bench_util.h - clock and memory-bandwidth ceiling shared by the C benchmarks. */
#ifndef PAGODA_BENCH_UTIL_H
#define PAGODA_BENCH_UTIL_H

/* Monotonic time in seconds. */
double bench_now(void);
/* Host copy bandwidth with THREADS threads over a 512 MiB buffer for about SECS seconds:
 * bytes read + bytes written per second, in GB/s (the ceiling for memory-bound CPU kernels). */
double bench_copy_gbps(int threads, double secs);

#endif
