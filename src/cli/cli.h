/* cli.h - the subcommands of the pagoda binary; each lives in its own cli_*.c file. */
#ifndef PAGODA_CLI_H
#define PAGODA_CLI_H

/* Each takes the arguments after the subcommand name (argv[0] is the subcommand) and returns
 * the process exit code: 0 ok, 1 runtime error, 2 usage error. */
int cli_run(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_perplexity(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_render_template(int argc, char **argv);
int cli_serve(int argc, char **argv);

#endif
