#include <config.h>

#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "log.h"

static int
plugins_check(int argc, char **argv)
{
  if (eph_cli_operands("plugins", argc, argv, 0) < 0) {
    fputs("usage: ephemeral plugins\n", stderr);
    return 2;
  }
  return -1;
}

static int
config_check(int argc, char **argv)
{
  int n = eph_cli_operands("config", argc, argv, 1);
  if (n == 1 && strcmp(argv[optind], "check") != 0 && strcmp(argv[optind], "keys") != 0)
    eph_error("config: unknown subcommand '%s'", argv[optind]);
  else if (n == 1)
    return -1;
  fputs("usage: ephemeral config check | config keys\n", stderr);
  return 2;
}

const eph_cli_command_t eph_cli_commands[] = {
    {"plugins", "plugins", "list the loaded plugins (name, kind, version, ABI, path)",
     "Exit status: 0 when every enabled plugin loaded, 1 when one was refused, 2 for a usage\n"
     "error.\n",
     true, 1, plugins_check, eph_cmd_plugins},
    {"config", "config check | config keys",
     "validate the configuration (exit 1 on an error) or list every documented key",
     "  check   parse ephemeral.conf and conf.d, load the enabled plugins, check every key\n"
     "  keys    print every documented key: block, name, type, default, unit, description\n"
     "Exit status: 0 when the configuration is valid (warnings included), 1 on an error,\n"
     "2 for a usage error.\n",
     true, 1, config_check, eph_cmd_config},
    {"exec", EPH_CLI_EXEC_USAGE, "run one command in a fresh sandbox; exit with its status",
     EPH_CLI_EXEC_HELP, EPH_CLI_LAZY, 1, eph_cmd_exec_check, eph_cmd_exec},
    {"run", EPH_CLI_RUN_USAGE, "run a request end to end and print its timeline", EPH_CLI_RUN_HELP,
     EPH_CLI_LAZY, 1, eph_cmd_run_check, eph_cmd_run},
    {"runs", EPH_CLI_RUNS_USAGE,
     "list past runs, show one as JSON, or replay its timeline at its original pace",
     EPH_CLI_RUNS_HELP, false, 1, eph_cmd_runs_check, eph_cmd_runs},
    {"orgs", EPH_CLI_ORGS_USAGE, "add credit to an organisation, or show its balance",
     EPH_CLI_ORGS_HELP, true, 1, eph_cmd_orgs_check, eph_cmd_orgs},
    {"keys", EPH_CLI_KEYS_USAGE, "make (printed once), revoke or list API keys of an organisation",
     EPH_CLI_KEYS_HELP, false, 1, eph_cmd_keys_check, eph_cmd_keys},
    {"doctor", "doctor",
     "check the store, ledger, backend and model offline (exit 0 healthy, 1 otherwise)",
     "  One line per component: \"NAME: ok\" or \"NAME: degraded: REASON\". A damaged\n"
     "  store or ledger file (PRAGMA quick_check), a full disk, a plugin that did not load\n"
     "  are reported; runs a dead process left are settled and recorded first.\n"
     "Exit status: 0 when every component is ok, 1 when one is degraded, 2 for a usage\n"
     "error.\n",
     true, 1, eph_cmd_doctor_check, eph_cmd_doctor},
    {"snapshots", EPH_CLI_SNAPSHOTS_USAGE,
     "list or prune what the backends keep to start sandboxes faster (microVM snapshots)",
     EPH_CLI_SNAPSHOTS_HELP, true, 1, eph_cmd_snapshots_check, eph_cmd_snapshots},
    {"db", "db migrate", "create or migrate the store's schema (SQLite file or `database`)",
     "  migrate   open the configured store, applying every pending migration (safe while\n"
     "            other nodes start: PostgreSQL migrations hold an advisory lock)\n"
     "Exit status: 0 when the schema is current, 1 when the store cannot be opened or\n"
     "migrated, 2 for a usage error.\n",
     false, 1, eph_cmd_db_check, eph_cmd_db},
    {0},
};

int
eph_cmd_plugins(eph_ctx_t *ctx, int argc, char **argv)
{
  int bad = plugins_check(argc, argv);
  if (bad >= 0)
    return bad;
  printf("%-18s %-8s %-8s %-5s %s\n", "NAME", "KIND", "VERSION", "ABI", "PATH");
  for (size_t i = 0; i < ctx->plugins.n; i++) {
    const eph_plugin_slot_t *s = &ctx->plugins.slots[i];
    char abi[16];
    snprintf(abi, sizeof abi, "%u.%u", s->desc->abi_major, s->desc->abi_minor);
    printf("%-18s %-8s %-8s %-5s %s\n", s->desc->name, eph_kind_name(s->desc->kind),
           s->desc->version ? s->desc->version : "-", abi, s->path);
  }
  return ctx->plugins.refused ? 1 : 0;
}

int
eph_cmd_config(eph_ctx_t *ctx, int argc, char **argv)
{
  int bad = config_check(argc, argv);
  if (bad >= 0)
    return bad;
  if (strcmp(argv[optind], "keys") == 0) {
    eph_config_keys_print(stdout, "ephemeral.conf", eph_core_config_keys, NULL);
    for (size_t i = 0; i < ctx->plugins.n; i++)
      eph_config_keys_print(stdout, ctx->plugins.slots[i].desc->name,
                            ctx->plugins.slots[i].config_keys, NULL);
    return 0;
  }
  int enabled = 0;
  for (size_t i = 0; i < ctx->config.n_blocks; i++) {
    const eph_config_block_t *b = &ctx->config.blocks[i];
    enabled += b->enabled;
  }
  if (ctx->plugins.refused) {
    fprintf(stderr, "config check: %d plugin(s) refused\n", ctx->plugins.refused);
    return 1;
  }
  eph_error_t err = {0};
  if (eph_ctx_check_selected(ctx, &err) < 0) {
    fprintf(stderr, "config check: %s\n", err.message);
    return 1;
  }
  printf("%s: ok (%zu plugin(s) loaded of %d enabled, %d warning(s))\n",
         ctx->config.main_path ? ctx->config.main_path : "(embedded defaults)", ctx->plugins.n,
         enabled, ctx->config.warnings);
  return 0;
}
