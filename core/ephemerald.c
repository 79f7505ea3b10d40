/* ephemerald: the HTTP API daemon. A foreground process suited to systemd: logs to stderr,
 * sends READY=1 to $NOTIFY_SOCKET once it listens (a plain datagram, no libsystemd), and on
 * SIGTERM or SIGINT drains (see eph_server_drain) and exits 0 with every reservation
 * settled. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cluster.h"
#include "context.h"
#include "log.h"
#include "server.h"
#include "util.h"

static void
usage(FILE *out)
{
  fprintf(out, "Usage: ephemerald [OPTIONS]\n"
               "\n"
               "Serve the ephemeral HTTP API (POST /v1/runs, live events, the playground page).\n"
               "\n"
               "Options:\n"
               "  -l, --listen ADDR:PORT  address to listen on (default: config server.listen,\n"
               "                          127.0.0.1:8080; [::1]:PORT for IPv6; port 0 = any)\n"
               "  -c, --config FILE       ephemeral.conf to use (its conf.d/ beside it; also\n"
               "                          EPHEMERAL_CONFIG)\n"
               "      --plugin-dir DIR    load plugins from DIR\n"
               "      --state-dir DIR     state directory (also EPHEMERAL_STATE_DIR)\n"
               "      --database URL      shared PostgreSQL store (also EPHEMERAL_DATABASE)\n"
               "  -v, --verbose           log debug messages too (default: info)\n"
               "  -q, --quiet             log errors only\n"
               "      --routes            print the routes served and exit\n"
               "  -h, --help              show this help\n"
               "  -V, --version           show the version\n"
               "\n"
               "Signals: SIGTERM/SIGINT drain (queued runs abandoned, running runs get\n"
               "server.drain_grace_seconds, then are cancelled) and exit 0.\n"
               "\n"
               "Exit status: 0 after a drain (or --help, --version, --routes); 1 when it\n"
               "cannot start (configuration, plugins, database, state directory, the\n"
               "address in use); 2 on a usage error (an unknown option, a bad --listen).\n");
}

/* sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET ('@' = abstract). */
static void
notify(const char *state)
{
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(path);
  memcpy(sa.sun_path, path, n);
  if (sa.sun_path[0] == '@')
    sa.sun_path[0] = '\0';
  cleanup_close int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return;
  if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
    eph_warn("NOTIFY_SOCKET %s: %s", path, strerror(errno));
}

/* --listen, when given: checked before anything is opened; it overrides server.listen. */
static const char *listen_arg;

/* The daemon's checks that need the configuration but no state (eph_ctx_options_t
 * before_state): the address it will listen on, then the cluster's database. A daemon
 * refused here leaves no state directory behind. */
static int
before_state(const eph_ctx_t *ctx, eph_error_t *err)
{
  struct sockaddr_storage ss;
  unsigned len;
  if (!listen_arg &&
      eph_server_parse_listen(eph_config_values(&ctx->config)->server.listen, &ss, &len, err) < 0)
    return eph_error_wrap(err, "server.listen");
  return eph_cluster_probe(ctx, err);
}

int
main(int argc, char **argv)
{
  static const struct option options[] = {
      {"listen", required_argument, NULL, 'l'},
      {"config", required_argument, NULL, 'c'},
      {"plugin-dir", required_argument, NULL, 'P'},
      {"state-dir", required_argument, NULL, 'S'},
      {"verbose", no_argument, NULL, 'v'},
      {"quiet", no_argument, NULL, 'q'},
      {"routes", no_argument, NULL, 'R'},
      {"database", required_argument, NULL, 'D'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {0},
  };
  eph_malloc_tune();

  /* The database is opened once before anything is created: a daemon that cannot reach it
   * (or is given a bad one) exits leaving the state directory as it found it. */
  eph_ctx_options_t copt = {.daemon = true, .load_plugins = true, .before_state = before_state};
  int verbose = 0, c;
  eph_log_set_program("ephemerald");
  signal(SIGPIPE, SIG_IGN);
  while ((c = getopt_long(argc, argv, "l:c:vqhV", options, NULL)) != -1) {
    switch (c) {
    case 'l':
      listen_arg = optarg;
      break;
    case 'R':
      eph_server_print_routes(stdout);
      return 0;
    case 'h':
      usage(stdout);
      return 0;
    case 'V':
      printf("ephemerald %s (plugin ABI %d.%d)\n", PACKAGE_VERSION, EPH_ABI_MAJOR, EPH_ABI_MINOR);
      return 0;
    default:
      if (eph_ctx_common_option(c, optarg, &copt, &verbose))
        break;
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }
  /* Arguments are checked before anything is created or opened: `--listen nonsense` used to
   * leave a fresh state directory (its store, ledger and qemu/) behind. */
  if (listen_arg) {
    struct sockaddr_storage ss;
    unsigned len;
    eph_error_t lerr = {0};
    if (eph_server_parse_listen(listen_arg, &ss, &len, &lerr) < 0) {
      /* A mistake in the arguments, as a missing ADDR:PORT is (getopt's): 2, not 1. */
      eph_error("--listen: %s", lerr.message);
      return 2;
    }
  }
  /* The daemon says what it does: info by default, debug with -v. */
  eph_log_set_level(verbose > 0 ? EPH_LOG_DEBUG : verbose < 0 ? EPH_LOG_ERROR : EPH_LOG_INFO);
  /* Event times are milliseconds as seconds: "0.025", not json-c's "%.17g"
   * "0.025000000000000001". */
  json_c_set_serialization_double_format("%.15g", JSON_C_OPTION_GLOBAL);

  /* The unit hands its capabilities over as ambient ones (a non-root User= has no other
   * way under NoNewPrivileges): the daemon keeps them (permitted, effective), but nothing
   * it executes may inherit them. Without this QEMU, started by backend-qemu in the
   * host's namespaces, would run with CAP_SETUID and CAP_SETGID. EINVAL: a kernel
   * without ambient capabilities has nothing to clear. */
  int e;
  if ((e = eph_clear_ambient_caps()) < 0) {
    eph_error("cannot clear the ambient capabilities: %s", strerror(-e));
    return 1;
  }

  /* Signals are taken by sigwait() below; every thread started from here on blocks them. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);

  eph_ctx_t ctx;
  eph_error_t err = {0};
  /* State files (the ledger's SQLite file and its -wal/-shm, created by its plugin's init)
   * are 0600 whoever started the daemon, by hand too; the umask goes back afterwards: the
   * sandboxes build world-readable trees for their unprivileged worker. */
  mode_t umask_before = umask(077);
  int opened = eph_ctx_open(&ctx, &copt, &err);
  umask(umask_before);
  if (opened < 0) {
    eph_error("%s", err.message);
    return 1;
  }
  if (ctx.plugins.refused)
    eph_warn("%d plugin(s) refused; see above", ctx.plugins.refused);
  /* A daemon whose configured backend or model plugin is not there would only fail every
   * run: refuse to start, naming the key. */
  if (eph_ctx_check_selected(&ctx, &err) < 0) {
    eph_error("%s", err.message);
    eph_ctx_close(&ctx);
    return 1;
  }
  eph_server_options_t sopt;
  if (eph_server_options_from_config(&ctx, &sopt, &err) < 0) {
    eph_error("%s", err.message);
    eph_ctx_close(&ctx);
    return 1;
  }
  if (listen_arg)
    snprintf(sopt.listen, sizeof sopt.listen, "%s", listen_arg);
  eph_server_t *srv = NULL;
  if (eph_server_start(&ctx, &sopt, &srv, &err) < 0) {
    eph_error("%s", err.message);
    eph_ctx_close(&ctx);
    return 1;
  }
  eph_info("listening on %s (state %s, %d worker(s), queue %d)", eph_server_url(srv), ctx.state_dir,
           sopt.max_concurrent_runs, sopt.max_queued_runs);
  /* Always printed, whatever the log level: scripts read the real port from it. */
  fprintf(stderr, "ephemerald: listening on %s\n", eph_server_url(srv));
  fflush(stderr);
  cleanup_free char *ready = eph_xasprintf("READY=1\nSTATUS=listening on %s", eph_server_url(srv));
  notify(ready);

  int sig = 0;
  for (;;) {
    if (sigwait(&set, &sig) != 0)
      continue;
    if (sig == SIGHUP) {
      eph_info("SIGHUP ignored (restart to reload the configuration)");
      continue;
    }
    break;
  }
  eph_info("%s: draining (grace %d s)", strsignal(sig), sopt.drain_grace_seconds);
  notify("STOPPING=1");
  eph_server_drain(srv, sopt.drain_grace_seconds);
  eph_server_free(srv);
  eph_ctx_close(&ctx);
  eph_info("stopped; every reservation is settled");
  return 0;
}
