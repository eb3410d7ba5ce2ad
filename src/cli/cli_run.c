/* cli_run.c - placeholder until the subcommand lands (replaced by its owner). */
#include <stdio.h>

#include "cli/cli.h"

int cli_run(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "pagoda %s: not available in this build yet\n", argv[0]);
  return 1;
}
