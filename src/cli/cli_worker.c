/* cli_worker.c - the worker side of multi-process tensor parallelism in the CLI: `pagoda run`,
 * `bench` and `serve` started with --tp-rank R > 0 (or $PAGODA_TP_RANK) run rank 0's model calls
 * until rank 0's command ends, torchrun-style: every rank runs the same command line. */
#include <stdio.h>

#include "cli/engine_flags.h"

int cli_tp_worker(const struct pagoda_engine_params *p, int *rc) {
  int rank = pagoda_tp_rank(p);
  if (rank < 0) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    *rc = 2;
    return 1;
  }
  if (rank == 0)
    return 0;
  if (pagoda_tp_worker_run(p) != PAGODA_OK) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    *rc = 1;
  } else {
    *rc = 0;
  }
  return 1;
}
