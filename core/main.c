/* ephemeral: the command-line entry point. Global options come before the subcommand:
 *   ephemeral [-v] [--config FILE] [--plugin-dir DIR] [--state-dir DIR] COMMAND [ARGS]   */
#include <config.h>

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "context.h"
#include "log.h"
#include "util.h"

/* The help's width and the column of the commands' descriptions. */
enum { HELP_WIDTH = 79, HELP_COLUMN = 31 };

/* Prints text from column `col` (the cursor is there), words wrapped before HELP_WIDTH
 * onto lines starting at column `indent`; a space inside [...] never breaks, so an option
 * and its value stay together. Ends the line. */
static void
print_wrapped(FILE *out, const char *text, int col, int indent)
{
  const char *p = text;
  while (*p) {
    /* The next word: up to a space outside brackets. */
    const char *end = p;
    for (int depth = 0; *end && (*end != ' ' || depth > 0); end++)
      depth += *end == '[' ? 1 : *end == ']' && depth > 0 ? -1 : 0;
    int len = (int)(end - p);
    if (p != text && col + 1 + len > HELP_WIDTH) {
      fprintf(out, "\n%*s", indent, "");
      col = indent;
    } else if (p != text) {
      fputc(' ', out);
      col++;
    }
    fprintf(out, "%.*s", len, p);
    col += len;
    p = *end ? end + 1 : end;
  }
  fputc('\n', out);
}

static void
usage(FILE *out)
{
  fprintf(out, "Usage: ephemeral [OPTIONS] COMMAND [ARGS...]\n"
               "\n"
               "Run an AI agent inside a disposable sandbox.\n"
               "\n"
               "Commands (`ephemeral COMMAND --help` for its options):\n");
  /* A syntax too long for its column gets a line (or more) of its own and its description
   * the next, at the column, as argparse and others do. */
  for (const eph_cli_command_t *c = eph_cli_commands; c->name; c++) {
    int len = (int)strlen(c->usage);
    if (2 + len + 1 <= HELP_COLUMN) {
      fprintf(out, "  %-*s", HELP_COLUMN - 2, c->usage);
    } else {
      fputs("  ", out);
      print_wrapped(out, c->usage, 2, 6);
      fprintf(out, "%*s", HELP_COLUMN, "");
    }
    print_wrapped(out, c->summary, HELP_COLUMN, HELP_COLUMN);
  }
  fprintf(out, "\n"
               "Options:\n"
               "  -c, --config FILE     ephemeral.conf to use (its conf.d/ beside it; also\n"
               "                        EPHEMERAL_CONFIG)\n"
               "      --plugin-dir DIR  load plugins from DIR\n"
               "      --state-dir DIR   state directory (also EPHEMERAL_STATE_DIR)\n"
               "      --database URL    shared PostgreSQL store (also EPHEMERAL_DATABASE)\n"
               "  -v, --verbose         log more (repeat for debug)\n"
               "  -q, --quiet           log errors only\n"
               "  -h, --help            show this help\n"
               "  -V, --version         show the version\n"
               "\n"
               "Exit status: 0 on success; for `run`, see ephemeral(1).\n");
}

int
main(int argc, char **argv)
{
  static const struct option options[] = {
      {"config", required_argument, NULL, 'c'},
      {"plugin-dir", required_argument, NULL, 'P'},
      {"state-dir", required_argument, NULL, 'S'},
      {"database", required_argument, NULL, 'D'},
      {"verbose", no_argument, NULL, 'v'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {0},
  };
  eph_malloc_tune();

  eph_ctx_options_t opt = {0};
  int verbose = 0, c;
  eph_log_set_program("ephemeral");
  /* A sandbox that dies mid-write (deadline, OOM) must not take the host process with it:
   * writes to its channel fail with EPIPE instead. */
  signal(SIGPIPE, SIG_IGN);
  /* Run under the unit's privileges (the daemon's user with ambient CAP_SETUID and
   * CAP_SETGID, as an operator's `runuser`/`setpriv` would), the CLI keeps them for the jail's
   * id maps and the microVMs' ids, but nothing it executes (QEMU, a helper) may inherit them. */
  int e;
  if ((e = eph_clear_ambient_caps()) < 0) {
    eph_error("cannot clear the ambient capabilities: %s", strerror(-e));
    return 1;
  }
  while ((c = getopt_long(argc, argv, "+c:vqhV", options, NULL)) != -1) {
    switch (c) {
    case 'h':
      usage(stdout);
      return 0;
    case 'V':
      printf("ephemeral %s (plugin ABI %d.%d)\n", PACKAGE_VERSION, EPH_ABI_MAJOR, EPH_ABI_MINOR);
      return 0;
    default:
      if (eph_ctx_common_option(c, optarg, &opt, &verbose))
        break;
      usage(stderr);
      return 2;
    }
  }
  if (verbose < 0)
    eph_log_set_level(EPH_LOG_ERROR);
  else if (verbose > 0)
    eph_log_set_level(verbose >= 2 ? EPH_LOG_DEBUG : EPH_LOG_INFO);

  if (optind >= argc) {
    usage(stderr);
    return 2;
  }
  /* The command's own argv (argv[0] its name); optind moves as the command parses it. */
  int at = optind;
  const char *name = argv[at];
  for (const eph_cli_command_t *cmd = eph_cli_commands; cmd->name; cmd++) {
    if (strcmp(cmd->name, name) != 0)
      continue;
    opt.load_plugins = cmd->load_plugins != 0;
    opt.lazy_plugins = cmd->load_plugins == EPH_CLI_LAZY;
    opt.lazy_backends = cmd->load_plugins == EPH_CLI_LAZY_BACKENDS;
    /* Subcommand-local help works without touching the state directory. */
    for (int i = at + 1; i < argc && strcmp(argv[i], "--") != 0; i++)
      if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
        /* The usage line, the summary, and the help its mistakes print too (cli.h). */
        fputs("Usage: ephemeral ", stdout);
        print_wrapped(stdout, cmd->usage, 17, 6);
        fputs("  ", stdout);
        print_wrapped(stdout, cmd->summary, 2, 2);
        if (cmd->help)
          printf("\n%s", cmd->help);
        return 0;
      }
    /* A mistake in the arguments is found before the context makes any state (a state
     * directory that was not there stays absent). */
    int bad = cmd->check ? cmd->check(argc - at, argv + at) : -1;
    if (bad >= 0)
      return bad;
    eph_ctx_t ctx;
    eph_error_t err = {0};
    /* The state files opened here (the ledger's SQLite file and its -wal/-shm) are created
     * 0600 whoever started us; the umask goes back for what runs later (sandboxes build
     * world-readable trees for their unprivileged worker). */
    mode_t umask_before = umask(077);
    int opened = eph_ctx_open(&ctx, &opt, &err);
    umask(umask_before);
    if (opened < 0) {
      eph_error("%s", err.message);
      return cmd->config_error_status;
    }
    int status = cmd->fn(&ctx, argc - at, argv + at);
    eph_ctx_close(&ctx);
    return status;
  }
  fprintf(stderr, "ephemeral: unknown command '%s' (see ephemeral --help)\n", name);
  return 2;
}
