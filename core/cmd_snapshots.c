/* `ephemeral snapshots list | prune [--max-bytes N] [--backend NAME]`: what the sandbox
 * backends keep between sandboxes to start them faster (the microVM backend's saved ready
 * guests), through the generic cache_list / cache_prune operations of eph_backend_ops_t: the
 * core names no backend here. Without --backend every loaded backend that keeps a cache is
 * asked. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "loader.h"
#include "log.h"

static void
usage(void)
{
  fputs("usage: ephemeral " EPH_CLI_SNAPSHOTS_USAGE "\n" EPH_CLI_SNAPSHOTS_HELP, stderr);
}

typedef struct listing {
  const char *backend;
  uint64_t bytes;
  int n;
} listing_t;

static void
print_entry(void *ctx, const eph_cache_entry_t *e)
{
  listing_t *l = ctx;
  char when[32] = "-";
  time_t t = (time_t)e->used_unix_s;
  struct tm tm;
  if (e->used_unix_s > 0 && gmtime_r(&t, &tm))
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  printf("%-14s %-42s %12" PRIu64 " %-20s %-6s %-64s %s\n", l->backend, e->name, e->size_bytes,
         when, e->in_use ? "yes" : "no", e->identity && *e->identity ? e->identity : "-",
         e->detail && *e->detail ? e->detail : "-");
  l->bytes += e->size_bytes;
  l->n++;
}

static void
print_removed(void *ctx, const eph_cache_entry_t *e)
{
  listing_t *l = ctx;
  printf("%s: removed %s (%" PRIu64 " bytes)\n", l->backend, e->name, e->size_bytes);
  l->bytes += e->size_bytes;
  l->n++;
}

/* `snapshots list | prune [--max-bytes N] [--backend NAME]`, as given (max_bytes -1: each
 * backend's configured limit). */
typedef struct snapshots_args {
  const char *backend_name;
  int64_t max_bytes;
  bool list;
} snapshots_args_t;

/* -1, or the exit status after the usage (0 for -h, 2 for a mistake). */
static int
snapshots_args(int argc, char **argv, snapshots_args_t *a)
{
  static const struct option opts[] = {{"backend", required_argument, NULL, 'b'},
                                       {"max-bytes", required_argument, NULL, 'm'},
                                       {"help", no_argument, NULL, 'h'},
                                       {0}};
  *a = (snapshots_args_t){.max_bytes = -1};
  optind = 0; /* 0: glibc re-initialises (main parsed its own options in "+" order) */
  for (int c; (c = getopt_long(argc, argv, "b:m:h", opts, NULL)) != -1;) {
    char *end;
    switch (c) {
    case 'b':
      a->backend_name = optarg;
      break;
    case 'm':
      errno = 0;
      a->max_bytes = strtoll(optarg, &end, 10);
      if (errno || *end || end == optarg || a->max_bytes < 0) {
        eph_error("snapshots: --max-bytes '%s': a number of bytes >= 0", optarg);
        usage();
        return 2;
      }
      break;
    default:
      usage();
      return c == 'h' ? 0 : 2;
    }
  }
  a->list = optind < argc && strcmp(argv[optind], "list") == 0;
  bool prune = optind < argc && strcmp(argv[optind], "prune") == 0;
  if (optind < argc && !a->list && !prune)
    eph_error("snapshots: unknown subcommand '%s'", argv[optind]);
  else if (optind + 1 < argc)
    eph_error("snapshots %s: unexpected argument '%s'", argv[optind], argv[optind + 1]);
  else if (a->list && a->max_bytes >= 0)
    eph_error("snapshots list: --max-bytes is prune's");
  if ((!a->list && !prune) || optind + 1 != argc || (a->list && a->max_bytes >= 0)) {
    usage();
    return 2;
  }
  return -1;
}

int
eph_cmd_snapshots_check(int argc, char **argv)
{
  snapshots_args_t a;
  return snapshots_args(argc, argv, &a);
}

int
eph_cmd_snapshots(eph_ctx_t *ctx, int argc, char **argv)
{
  snapshots_args_t a;
  int done = snapshots_args(argc, argv, &a);
  if (done >= 0)
    return done;
  const char *backend_name = a.backend_name;
  int64_t max_bytes = a.max_bytes;
  bool list = a.list;
  const eph_plugin_slot_t *only = NULL;
  eph_error_t err = {0};
  if (backend_name && !(only = eph_ctx_backend(ctx, backend_name, &err))) {
    fprintf(stderr, "snapshots: %s\n", err.message);
    return 1;
  }
  if (list)
    printf("%-14s %-42s %12s %-20s %-6s %-64s %s\n", "BACKEND", "NAME", "BYTES", "LAST USED",
           "IN USE", "IDENTITY", "DETAIL");
  int status = 0, asked = 0;
  for (size_t i = 0; i < ctx->plugins.n; i++) {
    const eph_plugin_slot_t *s = &ctx->plugins.slots[i];
    if (s->desc->kind != EPH_KIND_BACKEND || (only && s != only))
      continue;
    const eph_backend_ops_t *ops = s->desc->ops;
    if (!EPH_OPS_HAS(ops, eph_backend_ops_t, cache_list) ||
        !EPH_OPS_HAS(ops, eph_backend_ops_t, cache_prune))
      continue; /* keeps no cache */
    asked++;
    listing_t l = {.backend = s->desc->name};
    err = (eph_error_t){0};
    int r =
        list ? EPH_WITH_PLUGIN(s, ops->cache_list(s->state, print_entry, &l, &err))
             : EPH_WITH_PLUGIN(s, ops->cache_prune(s->state, max_bytes, print_removed, &l, &err));
    if (r < 0) {
      fprintf(stderr, "snapshots: %s: %s\n", s->desc->name, err.message);
      status = 1;
    } else if (list)
      fprintf(stderr, "%s: %d entr%s, %" PRIu64 " bytes\n", s->desc->name, l.n,
              l.n == 1 ? "y" : "ies", l.bytes);
    else
      printf("%s: %d removed, %" PRIu64 " bytes freed\n", s->desc->name, l.n, l.bytes);
  }
  if (only && !asked) {
    fprintf(stderr, "snapshots: %s keeps no snapshots\n", only->desc->name);
    return 1;
  }
  return status;
}
