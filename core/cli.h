/* The CLI's subcommand table. Each command gets the opened context and its own argv
 * (argv[0] = the command name) and returns the process exit status. */
#ifndef EPH_CLI_H
#define EPH_CLI_H

#include <stdbool.h>

#include "context.h"

/* load_plugins of a command that loads only the backend it uses (eph_ctx_options_t), and
 * of one that loads everything but the backends it does not use. */
#define EPH_CLI_LAZY 2
#define EPH_CLI_LAZY_BACKENDS 3

/* `exec`'s usage line: the command table's (cli.c) and exec's own usage (cmd_exec.c). A
 * macro, so that cmd_exec.c needs nothing of cli.c. */
#define EPH_CLI_EXEC_USAGE                                                                         \
  "exec [--backend NAME] [--timeout S] [--memory MIB] [--stdin] [--web] -- CMD [ARG...]"

typedef struct eph_cli_command {
  const char *name;
  const char *usage;       /* "plugins", "exec [--backend NAME] -- CMD [ARG...]" */
  const char *summary;     /* one line */
  const char *help;        /* more lines for `ephemeral CMD --help`, or NULL */
  int load_plugins;        /* false: none; true: all enabled; EPH_CLI_LAZY*: see above */
  int config_error_status; /* exit status when the context cannot be opened */
  int (*fn)(eph_ctx_t *ctx, int argc, char **argv);
} eph_cli_command_t;

extern const eph_cli_command_t eph_cli_commands[]; /* ends with {0} */

struct option;
/* getopt_long over a subcommand's options, argv[0] being the subcommand ("list",
 * "create": permuting never moves it); set optind = 0 before the first call. An unknown
 * option or a missing value is logged as an error naming it and cmd ("runs list"), and
 * returns '?'; otherwise getopt_long's result (-1 at the end). */
int eph_cli_getopt(const char *cmd, int argc, char **argv, const struct option *opts);

int eph_cmd_plugins(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_config(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_run(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_runs(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_orgs(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_keys(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_doctor(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_snapshots(eph_ctx_t *ctx, int argc, char **argv); /* core/cmd_snapshots.c */
int eph_cmd_db(eph_ctx_t *ctx, int argc, char **argv);

#endif
