/* `ephemeral exec [--backend NAME] [--timeout S] [--memory MIB] [--stdin] [--web] -- CMD [ARG...]`:
 * runs one command as the worker in a fresh sandbox, streams its output live to our
 * stdout/stderr and destroys the sandbox.
 *
 * Exit status, as coreutils timeout(1) and shells do: the command's own status; 128+N when
 * it was killed by signal N; 124 when it hit --timeout; 125 when ephemeral itself failed
 * (no backend, the sandbox did not boot, or its destroy left something behind).
 *
 * --web gives the sandbox the egress proxy a run granting `web` gets (same policy: the
 * core's `egress` group); each connection is logged to stderr ("web: CONNECT host:443"), nothing
 * is charged (exec has no ledger). If the egress cannot be set up the command does not
 * run: exec is the tool to test it. */
#include <config.h>

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../guest/protocol.h"
#include "cli.h"
#include "context.h"
#include "egress.h"
#include "guest_client.h"
#include "log.h"
#include "sandbox.h"
#include "util.h"

#define EXIT_FAILED 125
#define EXIT_TIMEOUT 124
#define BOOT_GRACE_MS 60000

/* The sandbox the signal thread may cancel; the lock keeps destroy from freeing it under
 * a cancel in progress. */
static pthread_mutex_t current_lock = PTHREAD_MUTEX_INITIALIZER;
static eph_sbx_t *current_sbx;
static atomic_int interrupted_by;

static void
set_current(eph_sbx_t *s)
{
  pthread_mutex_lock(&current_lock);
  current_sbx = s;
  if (s && atomic_load(&interrupted_by)) /* interrupted while booting */
    eph_sbx_cancel(s);
  pthread_mutex_unlock(&current_lock);
}

static void
write_all(int fd, const char *data, size_t bytes)
{
  while (bytes > 0) {
    ssize_t w = write(fd, data, bytes);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return; /* our reader went away: keep draining so the command still ends */
    data += w;
    bytes -= (size_t)w;
  }
}

static void
on_output(void *opaque, int stream, const char *data, size_t bytes)
{
  (void)opaque;
  write_all(stream == 2 ? STDERR_FILENO : STDOUT_FILENO, data, bytes);
}

/* SIGINT/SIGTERM/SIGHUP cancel the command (it is killed inside the sandbox, which is then
 * destroyed normally); SIGUSR1 only ends this thread. */
static void *
signal_thread(void *arg)
{
  sigset_t *set = arg;
  for (;;) {
    int sig = 0;
    if (sigwait(set, &sig) != 0 || sig == SIGUSR1)
      return NULL;
    atomic_store(&interrupted_by, sig);
    pthread_mutex_lock(&current_lock);
    if (current_sbx)
      eph_sbx_cancel(current_sbx);
    pthread_mutex_unlock(&current_lock);
  }
}

/* The signal thread, started by eph_sbx_create_booting once the backend has cloned (see
 * below) and while the guest boots. */
typedef struct signal_thread_start {
  pthread_t thr;
  sigset_t *set;
  bool started;
} signal_thread_start_t;

static void
start_signal_thread(void *opaque)
{
  signal_thread_start_t *st = opaque;
  st->started = pthread_create(&st->thr, NULL, signal_thread, st->set) == 0;
}

static int
log_egress(void *opaque, const char *method, const char *target, const char *refusal,
           eph_error_t *err)
{
  (void)opaque;
  if (refusal)
    fprintf(stderr, "web: %s %s · refused: %s\n", method, target, refusal);
  else
    fprintf(stderr, "web: %s %s\n", method, target);
  return 0;
}

static void
usage(FILE *f)
{
  /* The command table's usage line and help (cli.h), which `exec --help` prints too. */
  fputs("usage: ephemeral " EPH_CLI_EXEC_USAGE "\n" EPH_CLI_EXEC_HELP, f);
}

static int
read_stdin(char **data, size_t *bytes)
{
  int r = eph_read_fd(STDIN_FILENO, EPH_PROTO_MAX_DATA_BYTES, data, bytes);
  if (r == -EFBIG)
    eph_error("exec: --stdin: more than %u bytes", EPH_PROTO_MAX_DATA_BYTES);
  else if (r < 0)
    eph_error("exec: reading stdin: %s", strerror(-r));
  return r == -EFBIG ? -E2BIG : r;
}

/* The options of exec, as given; cmd: the index of CMD in argv. */
typedef struct exec_args {
  const char *backend_name;
  long long timeout_s, memory_mib;
  bool feed_stdin, web;
  int cmd;
} exec_args_t;

/* -1, or the exit status after the usage (0 for -h, 2 for a mistake). */
static int
exec_args(int argc, char **argv, exec_args_t *a)
{
  static const struct option opts[] = {
      {"backend", required_argument, NULL, 'b'},
      {"timeout", required_argument, NULL, 't'},
      {"memory", required_argument, NULL, 'm'},
      {"stdin", no_argument, NULL, 'i'},
      {"web", no_argument, NULL, 'w'},
      {"help", no_argument, NULL, 'h'},
      {0},
  };
  *a = (exec_args_t){.timeout_s = EPH_GUEST_DEFAULT_TIMEOUT_MS / 1000};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "+b:t:m:iwh", opts, NULL)) != -1) {
    char *end = NULL;
    switch (c) {
    case 'b':
      a->backend_name = optarg;
      break;
    case 't':
      a->timeout_s = strtoll(optarg, &end, 10);
      if (*end || a->timeout_s <= 0 || a->timeout_s > 86400) {
        eph_error("exec: --timeout '%s': expected seconds within 1..86400", optarg);
        usage(stderr);
        return 2;
      }
      break;
    case 'm':
      a->memory_mib = strtoll(optarg, &end, 10);
      if (*end || a->memory_mib <= 0 || a->memory_mib > (1LL << 30)) {
        eph_error("exec: --memory '%s': expected MiB, a positive number", optarg);
        usage(stderr);
        return 2;
      }
      break;
    case 'i':
      a->feed_stdin = true;
      break;
    case 'w':
      a->web = true;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind >= argc) {
    usage(stderr);
    return 2;
  }
  a->cmd = optind;
  return -1;
}

int
eph_cmd_exec_check(int argc, char **argv)
{
  exec_args_t a;
  return exec_args(argc, argv, &a);
}

int
eph_cmd_exec(eph_ctx_t *ctx, int argc, char **argv)
{
  exec_args_t a;
  int done = exec_args(argc, argv, &a);
  if (done >= 0)
    return done;
  const char *backend_name = a.backend_name;
  long long timeout_s = a.timeout_s, memory_mib = a.memory_mib;
  bool feed_stdin = a.feed_stdin, web = a.web;

  eph_error_t err = {0};
  const eph_plugin_slot_t *backend = eph_ctx_backend(ctx, backend_name, &err);
  if (!backend) {
    eph_error("exec: %s", err.message);
    return EXIT_FAILED;
  }
  cleanup_free char *stdin_data = NULL;
  size_t stdin_bytes = 0;
  if (feed_stdin && read_stdin(&stdin_data, &stdin_bytes) < 0)
    return EXIT_FAILED;

  char run_id[4 + 33] = "run_";
  if (eph_random_hex(run_id + 4, 16) < 0) {
    eph_error("exec: no randomness for the sandbox name");
    return EXIT_FAILED;
  }
  eph_sandbox_spec_t spec = {
      .struct_size = sizeof spec,
      .run_id = run_id,
      /* tmpfs pages count as memory: with a memory limit, scratch gets half of it. */
      .limits = {.memory_bytes = (uint64_t)memory_mib << 20,
                 .scratch_bytes = (uint64_t)memory_mib << 19},
      .deadline_ms = eph_now_ms() + timeout_s * 1000 + BOOT_GRACE_MS,
      .network = 0,
  };

  /* Signals go to one thread that cancels; every other thread keeps them blocked. */
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  signal_thread_start_t st = {.set = &set};
  bool thread_told = false;

  /* The signal thread starts only once the backend has made the sandbox (while its guest
   * boots: start_signal_thread): a backend may clone() its sandbox's first process, and a
   * child cloned while another thread holds a libc or sanitizer lock would hang on it. A
   * signal arriving meanwhile stays pending and is taken by the thread, which then cancels
   * (set_current below: the sandbox it cancels exists from then on). */
  int status = EXIT_FAILED;
  eph_sbx_t *sbx = NULL;
  eph_egress_t *egress = NULL;
  eph_net_policy_t policy = {0};
  if (web) {
    eph_egress_options_t eo;
    if (eph_egress_load_config(&ctx->config, &ctx->host, &eo, &policy, &err) < 0) {
      eph_error("exec: --web: %s", err.message);
      goto out;
    }
    eo.policy = &policy;
    eo.announce = log_egress;
    if (eph_egress_start(&eo, &egress, &err) < 0) {
      eph_error("exec: --web: %s", err.message);
      goto out;
    }
    eph_egress_spec(egress, &spec);
  }
  if (eph_sbx_create_booting(backend, &spec, start_signal_thread, &st, &sbx, &err) < 0) {
    eph_error("exec: %s", err.message);
    goto out;
  }
  set_current(sbx);

  eph_exec_request_t req = {
      .struct_size = sizeof req,
      .argv = (const char *const *)(argv + a.cmd),
      .stdin_data = stdin_data,
      .stdin_bytes = stdin_bytes,
      .timeout_ms = (uint32_t)(timeout_s * 1000),
      .output_cap_bytes = 2, /* everything is streamed to us; keep nothing */
      .on_output = on_output,
  };
  eph_exec_result_t res = {.struct_size = sizeof res};
  if (eph_sbx_exec(sbx, &req, &res, &err) < 0) {
    eph_error("exec: %s", err.message);
  } else {
    if (res.reason == EPH_END_TIMEOUT)
      status = EXIT_TIMEOUT;
    else if (res.signal)
      status = 128 + res.signal;
    else
      status = res.exit_code;
    if (atomic_load(&interrupted_by))
      status = 128 + atomic_load(&interrupted_by);
    if (res.reason != EPH_END_EXITED)
      eph_info("exec: command ended: %s", eph_end_reason_name(res.reason));
    if (res.reason == EPH_END_OOM || res.reason == EPH_END_PIDS_EXHAUSTED ||
        res.reason == EPH_END_DISK_FULL || res.reason == EPH_END_TIMEOUT)
      eph_warn("exec: the command ended by %s", eph_end_reason_name(res.reason));
    eph_exec_result_clear(&res);
  }
  set_current(NULL);
  /* The signal thread has nothing left to cancel: it ends while the sandbox is destroyed
   * (joined below), rather than after. A signal arriving from here on stays pending. */
  if (st.started) {
    pthread_kill(st.thr, SIGUSR1);
    thread_told = true;
  }
  eph_sandbox_report_t report = {.struct_size = sizeof report};
  eph_error_t derr = {0};
  if (eph_sbx_destroy(sbx, &report, &derr) < 0) {
    eph_error("exec: %s", derr.message);
    status = EXIT_FAILED;
  }
out:
  eph_egress_stop(egress);
  eph_net_policy_free(&policy);
  if (st.started) {
    if (!thread_told) /* the guest never said hello */
      pthread_kill(st.thr, SIGUSR1);
    pthread_join(st.thr, NULL);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return status;
}
