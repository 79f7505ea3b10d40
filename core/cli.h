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

/* Each subcommand's usage line and its help (its options, defaults and exit statuses): the
 * command table's (cli.c: `ephemeral --help`, `ephemeral CMD --help` on stdout) and the
 * subcommand's own usage after a mistake (cmd_exec.c, cmd_run.c: on stderr), one text for
 * both so that neither says less. Macros, so that the cmd_*.c units need nothing of cli.c
 * (tests/check-cycles). A help is lines of at most 79 columns, each ending in a newline. */
#define EPH_CLI_EXEC_USAGE                                                                         \
  "exec [--backend NAME] [--timeout S] [--memory MIB] [--stdin] [--web] -- CMD [ARG...]"
#define EPH_CLI_EXEC_HELP                                                                          \
  "  --backend NAME  sandbox backend (jail, qemu); default: the configured one\n"                  \
  "  --timeout S     kill the command after S seconds (exit status 124);\n"                        \
  "                  default 300\n"                                                                \
  "  --memory MIB    the sandbox's memory limit, half of it its /tmp; default: the\n"              \
  "                  backend's\n"                                                                  \
  "  --stdin         feed our stdin (at most 512 KiB) to the command; default\n"                   \
  "                  /dev/null\n"                                                                  \
  "  --web           egress through the host's proxy, as a run granting web gets\n"                \
  "Exit status: the command's; 124 when --timeout killed it; 125 when ephemeral\n"                 \
  "itself failed (no backend, the sandbox did not boot, or its destroy left\n"                     \
  "something behind).\n"

#define EPH_CLI_RUN_USAGE                                                                          \
  "run [--json] [--quiet] [--backend NAME] [--replay FILE] [--record FILE] [--org ORG] "           \
  "REQUEST.json"
#define EPH_CLI_RUN_HELP                                                                           \
  "  --json          print the final run object instead of the timeline\n"                         \
  "  --quiet         do not print commands' output live under them\n"                              \
  "  --backend NAME  jail or qemu (default: config `backend`)\n"                                   \
  "  --replay FILE   answer model calls from a recorded transcript (offline)\n"                    \
  "  --record FILE   append the model's raw responses to FILE (a transcript)\n"                    \
  "  --org ORG       organisation billed (default: config `cli_org`)\n"                            \
  "REQUEST.json needs prompt, timeout_seconds and max_cost_micros (ephemeral(1)).\n"               \
  "Exit status: 0 succeeded, 1 failed, 2 invalid request, 3 timed_out,\n"                          \
  "4 budget_exhausted (or insufficient balance), 5 cancelled.\n"

#define EPH_CLI_RUNS_USAGE "runs list [--org ORG] [--limit N] | show ID | replay ID [--speed N]"
#define EPH_CLI_RUNS_HELP                                                                          \
  "  list [--org ORG] [--limit N]\n"                                                               \
  "                  the organisation's runs, newest first; --org: default config\n"               \
  "                  `cli_org`; --limit: 1..10000, default 20\n"                                   \
  "  show ID         the run as JSON, as GET /v1/runs/{id} answers it\n"                           \
  "  replay ID [--speed N]\n"                                                                      \
  "                  its timeline again at its original pace times N\n"                            \
  "                  (0.001..1000000, default 1), then its summary\n"                              \
  "Exit status: 0 on success, 1 when the store cannot be read or the run does not\n"               \
  "exist, 2 for a usage error.\n"

#define EPH_CLI_ORGS_USAGE "orgs credit ORG MICROS | orgs balance ORG"
#define EPH_CLI_ORGS_HELP                                                                          \
  "  credit ORG MICROS\n"                                                                          \
  "                  add MICROS, a positive integer of micro-dollars (1000000 =\n"                 \
  "                  $1), to ORG's balance (ORG is created if new), then print\n"                  \
  "                  the balance\n"                                                                \
  "  balance ORG     print ORG's available balance (credits - open reservations -\n"               \
  "                  billed) in micros and dollars\n"                                              \
  "Exit status: 0 on success, 1 when the store or the ledger fails, 2 for a usage\n"               \
  "error.\n"

#define EPH_CLI_KEYS_USAGE "keys create|revoke|list --org ORG [--name NAME] [--admin]"
#define EPH_CLI_KEYS_HELP                                                                          \
  "  create --org ORG --name NAME [--admin]\n"                                                     \
  "                  make an API key of ORG and print it (shown once: only its\n"                  \
  "                  hash is stored); --admin: a key for the /v1/admin routes\n"                   \
  "  revoke --org ORG --name NAME|KEY_ID\n"                                                        \
  "                  revoke ORG's key, named by its name or its id\n"                              \
  "  list --org ORG  list ORG's keys as JSON (never a secret)\n"                                   \
  "Exit status: 0 on success, 1 when the store fails, 2 for a usage error.\n"

#define EPH_CLI_SNAPSHOTS_USAGE "snapshots list | prune [--max-bytes N] [--backend NAME]"
#define EPH_CLI_SNAPSHOTS_HELP                                                                     \
  "  list [--backend NAME]\n"                                                                      \
  "                  one line per entry: backend, name, bytes, last used (UTC), in\n"              \
  "                  use, identity (SHA-256 of what it was made from), what that\n"                \
  "                  covers\n"                                                                     \
  "  prune [--max-bytes N] [--backend NAME]\n"                                                     \
  "                  remove entries, least recently used first, until each\n"                      \
  "                  backend's cache takes at most N bytes (default: its\n"                        \
  "                  configured limit, e.g. snapshot_max_bytes); an entry in use\n"                \
  "                  is never removed\n"                                                           \
  "Exit status: 0 on success, 1 when the cache cannot be read or changed, 2 for a\n"               \
  "mistake in the arguments.\n"

typedef struct eph_cli_command {
  const char *name;
  const char *usage;       /* "plugins", "exec [--backend NAME] -- CMD [ARG...]" */
  const char *summary;     /* one line */
  const char *help;        /* more lines for `ephemeral CMD --help`, or NULL */
  int load_plugins;        /* false: none; true: all enabled; EPH_CLI_LAZY*: see above */
  int config_error_status; /* exit status when the context cannot be opened */
  /* The arguments' mistakes, found before the context is opened (it creates the state
   * directory, the store's and the ledger's files, loads plugins): -1 when fn may run, else
   * the exit status (2) after printing the mistake and the usage on stderr. NULL: fn checks
   * its own. fn parses the same arguments again, the same way, for their values. */
  int (*check)(int argc, char **argv);
  int (*fn)(eph_ctx_t *ctx, int argc, char **argv);
} eph_cli_command_t;

extern const eph_cli_command_t eph_cli_commands[]; /* ends with {0} */

struct option;
/* getopt_long over a subcommand's options, argv[0] being the subcommand ("list",
 * "create": permuting never moves it); set optind = 0 before the first call. An unknown
 * option or a missing value is logged as an error naming it and cmd ("runs list"), and
 * returns '?'; otherwise getopt_long's result (-1 at the end). */
int eph_cli_getopt(const char *cmd, int argc, char **argv, const struct option *opts);
/* The operands of a command that takes no option (argv[0] = the command, as above): an
 * option, or an operand past the first max, is logged as an error naming it and cmd and
 * returns -1; else the number of operands, which start at argv[optind] (getopt_long moves
 * them after the options, and past a "--"). */
int eph_cli_operands(const char *cmd, int argc, char **argv, int max);

int eph_cmd_plugins(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_config(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_run(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_runs(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_orgs(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_keys(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_doctor(eph_ctx_t *ctx, int argc, char **argv);
int eph_cmd_snapshots(eph_ctx_t *ctx, int argc, char **argv); /* core/cmd_snapshots.c */
int eph_cmd_db(eph_ctx_t *ctx, int argc, char **argv);

/* The commands' argument checks (eph_cli_command_t.check). */
int eph_cmd_exec_check(int argc, char **argv);
int eph_cmd_run_check(int argc, char **argv);
int eph_cmd_runs_check(int argc, char **argv);
int eph_cmd_orgs_check(int argc, char **argv);
int eph_cmd_keys_check(int argc, char **argv);
int eph_cmd_doctor_check(int argc, char **argv);
int eph_cmd_snapshots_check(int argc, char **argv);
int eph_cmd_db_check(int argc, char **argv);

#endif
