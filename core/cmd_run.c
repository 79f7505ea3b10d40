/* `ephemeral run`, `runs`, `orgs`, `keys`: the CLI's side of runs and accounts. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "cli.h"
#include "log.h"
#include "run.h"
#include "runstore.h"
#include "store.h"
#include "cluster.h"
#include "util.h"
#include "support/org_name.h"

#define REQUEST_MAX_BYTES (8 * 1024 * 1024)

/* ------------------------------------------------------------------ printing */

/* What the model wrote (command text, answers, file names) reaches the operator's terminal
 * through these printers, so it is shown, never interpreted: a model could otherwise clear
 * the screen, retitle the window or write the clipboard (OSC 52). Every C0 control but
 * newline and tab, DEL, the C1 controls (U+0080..U+009F, UTF-8 C2 80..C2 9F: a CSI alone
 * is C2 9B), every byte that is not part of valid UTF-8 (a raw 9B is a CSI to a terminal
 * in an 8-bit mode) and the bidirectional embeddings, overrides and isolates (U+202A..
 * U+202E, U+2066..U+2069: they make a line read other than it runs) come out as `\xHH`
 * per byte; other UTF-8 passes unchanged.
 * Applied to every human-readable line whatever stdout is (a log viewed later with `cat` or
 * `less -R` interprets escapes too); `--json` output is JSON-escaped by json-c instead.
 * Returns a new string the caller frees; never NULL (aborts on out of memory, as
 * eph_xasprintf does). */
static char *
shown(const char *s)
{
  if (!s)
    s = "";
  size_t n = strlen(s);
  char *out = eph_xmalloc(n * 4 + 1), *o = out;
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  while (p < end) {
    size_t c = *p == '\n' || *p == '\t' ? 0 : eph_control_len(p);
    int len = c ? 0 : eph_utf8_seq(p, (size_t)(end - p));
    if (!c && len <= 0)
      c = 1; /* a byte that is not part of UTF-8 */
    else if (len == 3 && p[0] == 0xe2 &&
             ((p[1] == 0x80 && p[2] >= 0xaa && p[2] <= 0xae) ||
              (p[1] == 0x81 && p[2] >= 0xa6 && p[2] <= 0xa9)))
      c = 3;
    if (!c) {
      memcpy(o, p, (size_t)len);
      o += len;
      p += len;
    }
    for (; c > 0; c--)
      o += sprintf(o, "\\x%02x", *p++);
  }
  *o = '\0';
  return out;
}

/* A timeline line's continuation: a multi-line command (a here-document, or a command whose
 * text forges rows: "true\n  0.02  Sandbox  sandbox destroyed") goes on under the text
 * column behind a shell's PS2 prompt, never at the start of a line where rows begin. */
#define CONTINUATION "\n                          > "

/* s with every newline followed by CONTINUATION's indent and prompt. Takes s (freed). */
static char *
continued(char *s)
{
  size_t lines = 0;
  for (const char *c = s; (c = strchr(c, '\n')); c++)
    lines++;
  if (!lines)
    return s;
  char *out = eph_xmalloc(strlen(s) + lines * (sizeof CONTINUATION - 2) + 1), *o = out;
  for (const char *c = s; *c; c++) {
    if (*c == '\n') {
      memcpy(o, CONTINUATION, sizeof CONTINUATION - 1);
      o += sizeof CONTINUATION - 1;
    } else {
      *o++ = *c;
    }
  }
  *o = '\0';
  free(s);
  return out;
}

static void
print_event_line(FILE *out, double t, const char *source, const char *kind, const char *text)
{
  cleanup_free char *src = shown(source), *txt = continued(shown(text));
  if (strcmp(kind, "tool_result") == 0)
    fprintf(out, "%6s  %-17s   -> %s\n", "", "", txt);
  else
    fprintf(out, "%6.2f  %-17s %s\n", t, src, txt);
  fflush(out);
}

/* Live command output (`output` events; streamed model text, `model_delta`, alike) printed
 * under its command: indented, dimmed on a
 * terminal, at most LIVE_MAX_LINES lines per command, then "… N more lines" once the
 * command's next event comes. Chunks need not end at a newline: a line continues across
 * events. Every byte goes through shown(). */
#define LIVE_MAX_LINES 20
#define LIVE_INDENT "                            " /* under the command text */

typedef struct printer {
  FILE *out;
  bool tty;           /* dim the output */
  bool quiet;         /* --quiet: no live output */
  bool mid_line;      /* the last output line has no newline yet */
  int64_t lines;      /* lines started for the current command */
  int64_t more;       /* lines not printed past LIVE_MAX_LINES */
  int64_t delta_call; /* the model call whose "streaming" row is printed (0: none) */
} printer_t;

/* Closes the current command's output: ends a partial line, prints the "more" marker. */
static void
live_close(printer_t *p)
{
  if (p->mid_line)
    fputs(p->tty ? "\033[0m\n" : "\n", p->out);
  if (p->more)
    fprintf(p->out, "%s%s… %" PRId64 " more line%s%s\n", LIVE_INDENT, p->tty ? "\033[2m" : "",
            p->more, p->more == 1 ? "" : "s", p->tty ? "\033[0m" : "");
  p->mid_line = false;
  p->lines = p->more = 0;
}

static void
live_print(printer_t *p, const char *text)
{
  cleanup_free char *txt = shown(text);
  for (const char *s = txt; *s;) {
    const char *nl = strchr(s, '\n');
    size_t len = nl ? (size_t)(nl - s) : strlen(s);
    if (!p->mid_line) {
      p->lines++;
      if (p->lines > LIVE_MAX_LINES) {
        p->more++;
      } else {
        fputs(LIVE_INDENT, p->out);
      }
    }
    bool shown_line = p->lines <= LIVE_MAX_LINES;
    if (shown_line)
      fprintf(p->out, "%s%.*s%s", p->tty ? "\033[2m" : "", (int)len, s, p->tty ? "\033[0m" : "");
    if (nl) {
      if (shown_line)
        fputc('\n', p->out);
      p->mid_line = false;
      s = nl + 1;
    } else {
      p->mid_line = len > 0 || p->mid_line;
      s += len;
    }
  }
  fflush(p->out);
}

static void
print_any(printer_t *p, double t, const char *source, const char *kind, const char *text,
          json_object *data)
{
  if (strcmp(kind, "output") == 0 || strcmp(kind, "model_delta") == 0) {
    json_object *dropped = NULL;
    if (p->quiet)
      return;
    /* Streamed model text belongs under its own model call, whose model_call row only
     * comes when the call is over: the first delta prints a row for it. */
    int64_t call = strcmp(kind, "model_delta") == 0 && data ? eph_json_int64(data, "call") : 0;
    if (call > 0 && call != p->delta_call) {
      char row[64];
      snprintf(row, sizeof row, "model call %" PRId64 " streaming…", call);
      live_close(p);
      print_event_line(p->out, t, source, kind, row);
      p->delta_call = call;
    }
    if (data && json_object_object_get_ex(data, "dropped_bytes", &dropped)) {
      if (p->mid_line)
        live_print(p, "\n");
      live_print(p, text);
      live_print(p, "\n");
      return;
    }
    live_print(p, text);
    return;
  }
  live_close(p);
  print_event_line(p->out, t, source, kind, text);
}

static void
print_event(void *opaque, eph_run_t *run, const eph_event_t *ev)
{
  (void)run;
  print_any(opaque, (double)ev->t_ms / 1000.0, ev->source, ev->kind, ev->text, ev->data);
}

/* The product page's summary: header, saved output, cost line. */
static void
print_summary(FILE *out, json_object *run)
{
  json_object *usage = NULL, *output = NULL, *answer = NULL, *status = NULL, *id = NULL,
              *files = NULL, *error = NULL;
  json_object_object_get_ex(run, "usage", &usage);
  json_object_object_get_ex(run, "output", &output);
  json_object_object_get_ex(run, "status", &status);
  json_object_object_get_ex(run, "id", &id);
  json_object_object_get_ex(run, "error", &error);
  if (output) {
    json_object_object_get_ex(output, "answer", &answer);
    json_object_object_get_ex(output, "files", &files);
  }
  char billed[32], reserved[32], model[32], web[32], compute[32];
  const char *s = status ? json_object_get_string(status) : "?";
  char word[32];
  snprintf(word, sizeof word, "%s", s);
  word[0] = (char)(word[0] >= 'a' && word[0] <= 'z' ? word[0] - 32 : word[0]);
  for (char *p = word; *p; p++)
    if (*p == '_')
      *p = ' ';
  fprintf(out, "\n%s  %s  %s of %s\n", word, id ? json_object_get_string(id) : "",
          eph_format_dollars(eph_json_int64(usage, "billed_micros"), billed, sizeof billed),
          eph_format_dollars(eph_json_int64(usage, "reserved_micros"), reserved, sizeof reserved));
  if (error) {
    /* A provider's or plugin's message: a line break in it goes on under the text column
     * too (a 400 body forged a timeline row here). */
    cleanup_free char *e = continued(shown(json_object_get_string(error)));
    fprintf(out, "error: %s\n", e);
  }
  if (answer) {
    cleanup_free char *a = shown(json_object_get_string(answer));
    fprintf(out, "\nSaved output:\n%s\n", a);
  }
  for (size_t i = 0; files && i < json_object_array_length(files); i++) {
    json_object *f = json_object_array_get_idx(files, i), *p = NULL, *b = NULL, *e = NULL,
                *t = NULL;
    json_object_object_get_ex(f, "path", &p);
    json_object_object_get_ex(f, "bytes", &b);
    cleanup_free char *path = shown(p ? json_object_get_string(p) : "?");
    /* A file the run did not leave is not "0 bytes": say why it was not saved. */
    cleanup_free char *why = json_object_object_get_ex(f, "error", &e)
                                 ? continued(shown(json_object_get_string(e)))
                                 : NULL;
    if (why)
      fprintf(out, "output file %s: not saved: %s\n", path, why);
    else
      fprintf(out, "output file %s: %" PRId64 " bytes%s\n", path, b ? json_object_get_int64(b) : 0,
              json_object_object_get_ex(f, "truncated", &t) && json_object_get_boolean(t)
                  ? " (truncated)"
                  : "");
  }
  /* The parts as they add up to what was billed as shown in the header (largest remainder). */
  int64_t parts[3] = {eph_json_int64(usage, "model_micros"), eph_json_int64(usage, "web_micros"),
                      eph_json_int64(usage, "compute_micros")},
          cost[3];
  eph_dollars_split(parts, cost, 3);
  fprintf(out, "\nModel %s · Web %s · Compute %s\n",
          eph_format_dollars(cost[0], model, sizeof model),
          eph_format_dollars(cost[1], web, sizeof web),
          eph_format_dollars(cost[2], compute, sizeof compute));
}

/* ------------------------------------------------------------------ accounts */

static int
open_store(eph_ctx_t *ctx, eph_store_t **store)
{
  eph_error_t err = {0};
  if (eph_store_open_ctx(ctx, NULL, false, store, &err) < 0) {
    eph_error("%s", err.message);
    return -1;
  }
  return 0;
}

static const eph_plugin_slot_t *
ledger_slot(eph_ctx_t *ctx)
{
  const eph_plugin_slot_t *l = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  if (!l)
    eph_error("no ledger plugin is loaded (enable ledger-sqlite in conf.d)");
  return l;
}

/* The CLI's organisation gets its starting credit once per state directory. A marker file,
 * locked while the credit is made and written only after it, makes that once even with
 * several CLIs starting on a new directory at the same moment (none reserves before the
 * credit exists). A crash between the credit and the marker's write credits again: the
 * CLI's own demo credit, never a customer's money. */
static int
ensure_cli_credit(eph_ctx_t *ctx, const eph_plugin_slot_t *ledger, const char *org)
{
  int64_t credit = eph_config_values(&ctx->config)->cli_credit_micros;
  eph_error_t err = {0};
  cleanup_free char *marker = eph_xasprintf("%s/cli-credit-%s", ctx->state_dir, org);
  cleanup_close int fd = open(marker, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || flock(fd, LOCK_EX) < 0) {
    eph_error("%s: %s", marker, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size > 0)
    return 0; /* credited before */
  if (credit > 0) {
    const eph_ledger_ops_t *ops = ledger->desc->ops;
    if (EPH_WITH_PLUGIN(ledger, ops->credit(ledger->state, org, credit, &err)) < 0) {
      eph_error("crediting %s: %s", org, err.message);
      return -1;
    }
  }
  if (write(fd, "credited\n", 9) != 9 || fsync(fd) < 0) {
    eph_error("%s: %s", marker, strerror(errno));
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ run */

static eph_run_t *volatile current_run;

static void *
signal_thread(void *arg)
{
  sigset_t *set = arg;
  int sig;
  while (sigwait(set, &sig) == 0) {
    eph_run_t *run = current_run;
    if (run) {
      fprintf(stderr, "ephemeral: %s: cancelling the run\n", strsignal(sig));
      eph_run_cancel(run);
    }
  }
  return NULL;
}

/* sigwait is a cancellation point: the thread ends there, holding nothing. */
static void
signal_thread_stop(pthread_t thr, bool up)
{
  if (!up)
    return;
  pthread_cancel(thr);
  pthread_join(thr, NULL);
}

/* The options and the one operand of `run`, as given (no default applied). */
typedef struct run_args {
  bool json, quiet;
  const char *backend, *replay, *record, *org, *path;
} run_args_t;

static int
run_usage(void)
{
  fputs("usage: ephemeral " EPH_CLI_RUN_USAGE "\n" EPH_CLI_RUN_HELP, stderr);
  return 2;
}

/* -1, or 2 after the usage: a misspelt option or a missing value (named by getopt), not
 * exactly one REQUEST.json. */
static int
run_args(int argc, char **argv, run_args_t *a)
{
  static const struct option options[] = {
      {"json", no_argument, NULL, 'j'},
      {"backend", required_argument, NULL, 'b'},
      {"replay", required_argument, NULL, 'r'},
      {"record", required_argument, NULL, 'R'},
      {"org", required_argument, NULL, 'o'},
      {"quiet", no_argument, NULL, 'q'},
      {0},
  };
  *a = (run_args_t){0};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "+jqb:", options, NULL)) != -1) {
    switch (c) {
    case 'j':
      a->json = true;
      break;
    case 'q':
      a->quiet = true;
      break;
    case 'b':
      a->backend = optarg;
      break;
    case 'r':
      a->replay = optarg;
      break;
    case 'R':
      a->record = optarg;
      break;
    case 'o':
      a->org = optarg;
      break;
    default:
      return run_usage();
    }
  }
  if (optind != argc - 1)
    return run_usage();
  a->path = argv[optind];
  return -1;
}

int
eph_cmd_run_check(int argc, char **argv)
{
  run_args_t a;
  int bad = run_args(argc, argv, &a);
  if (bad >= 0)
    return bad;
  /* --org is a name the store takes (cli_org, the default, is checked once the
   * configuration is read: eph_cmd_run). */
  eph_error_t err = {0};
  if (a.org && eph_org_name_check(a.org, &err) < 0) {
    eph_error("--org: %s", err.message);
    return run_usage();
  }
  /* --replay names a transcript there is, a file (before any state or money: it was
   * checked after the CLI's organisation had been credited). */
  struct stat st;
  if (a.replay && (stat(a.replay, &st) < 0 || S_ISDIR(st.st_mode))) {
    eph_error("--replay %s: %s", a.replay, strerror(S_ISDIR(st.st_mode) ? EISDIR : errno));
    return run_usage();
  }
  /* REQUEST.json names a file there is (not a directory). Only a regular file is opened
   * here: a pipe or a FIFO is read once, by the command ("-" is its stdin). */
  if (strcmp(a.path, "-") == 0)
    return -1;
  int e = stat(a.path, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
  if (!e && S_ISREG(st.st_mode)) {
    int fd = open(a.path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
      e = errno;
    else
      close(fd);
  }
  if (!e)
    return -1;
  eph_error("%s: %s", a.path, strerror(e));
  return run_usage();
}

int
eph_cmd_run(eph_ctx_t *ctx, int argc, char **argv)
{
  run_args_t a;
  int bad = run_args(argc, argv, &a);
  if (bad >= 0)
    return bad;
  bool json = a.json, quiet = a.quiet;
  const char *backend = a.backend, *replay = a.replay, *record = a.record, *org = a.org;
  const char *path = a.path;
  eph_error_t err = {0};
  cleanup_free char *body = NULL;
  size_t len = 0;
  if (eph_read_file(strcmp(path, "-") == 0 ? "/dev/stdin" : path, REQUEST_MAX_BYTES, &body, &len,
                    &err) < 0) {
    eph_error("%s", err.message);
    return 2;
  }

  eph_request_limits_t limits = {.max_files_total_bytes = 16 * 1024 * 1024};
  const eph_core_conf_t *conf = eph_config_values(&ctx->config);
  limits.max_timeout_seconds = conf->max_timeout_seconds;
  limits.max_cost_micros = conf->max_cost_micros;
  limits.default_model = conf->default_model;
  limits.max_files_total_bytes = (size_t)conf->max_inline_files_bytes;
  eph_request_t req;
  const char *field = NULL;
  if (eph_request_parse(body, len, &limits, &req, &field, &err) < 0) {
    eph_error("%s: %s", path, err.message);
    return 2;
  }
  /* Only the plugins this request uses are loaded (the command's context is lazy); then a
   * granted connection is checked against them (eph_request_limits_t.plugins). */
  eph_run_load_plugins(ctx, &req, replay ? "replay:" : req.model);
  /* The daemon refuses to start on what `config check` refuses; a run does too (a misspelt
   * model_plugin included: every model plugin is loaded for a run that is not replayed). */
  if (!replay && eph_ctx_check_selected(ctx, &err) < 0) {
    eph_error("%s", err.message);
    eph_request_free(&req);
    return 2;
  }
  if (req.n_connections) {
    eph_request_free(&req);
    limits.plugins = &ctx->plugins;
    if (eph_request_parse(body, len, &limits, &req, &field, &err) < 0) {
      eph_error("%s: %s", path, err.message);
      return 2;
    }
  }
  if (req.webhook_url) {
    /* Accepted and never called would be a silent loss: only the daemon delivers. */
    eph_error("%s: field 'webhook_url': webhooks are delivered by ephemerald only", path);
    eph_request_free(&req);
    return 2;
  }

  const eph_plugin_slot_t *ledger = ledger_slot(ctx);
  if (!ledger) {
    eph_request_free(&req);
    return 1;
  }
  bool org_given = org != NULL;
  if (!org)
    org = eph_config_values(&ctx->config)->cli_org;
  /* Before any money moves: the ledger takes names the store refuses, and a reservation
   * whose run cannot be recorded under its org is a settlement of no run. */
  eph_error_t org_err = {0};
  if (eph_org_name_check(org, &org_err) < 0) {
    eph_error("%s: %s", org_given ? "--org" : "cli_org (ephemeral.conf)", org_err.message);
    eph_request_free(&req);
    return 2;
  }
  if (ensure_cli_credit(ctx, ledger, org) < 0) {
    eph_request_free(&req);
    return 1;
  }
  cleanup_free char *model_override = NULL;
  if (replay) {
    char *abs = realpath(replay, NULL);
    if (!abs) {
      eph_error("--replay %s: %s", replay, strerror(errno));
      eph_request_free(&req);
      return 2;
    }
    model_override = eph_xasprintf("replay:%s", abs);
    free(abs);
  }
  eph_store_t *store = NULL;
  if (open_store(ctx, &store) < 0) {
    eph_request_free(&req);
    return 1;
  }
  /* History older than retention_days goes before a new run is added. */
  int64_t retention = eph_config_values(&ctx->config)->retention_days;
  if (retention > 0 && eph_store_purge(store, (int)retention, &err) < 0)
    eph_warn("purging runs older than %lld days: %s", (long long)retention, err.message);

  /* Signals go to one thread that cancels the run; the run's own threads never see them.
   * The set is static: the thread reads it at every sigwait. The thread is cancelled and
   * joined before returning so that no thread of ours outlives the command: LeakSanitizer's
   * exit-time scan of a thread parked in sigwait crashed the CLI (losing its output). */
  static sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  pthread_t sigthr;
  bool sigthr_up = pthread_create(&sigthr, NULL, signal_thread, &set) == 0;

  eph_run_options_t opt = {
      .org = org,
      .backend = backend,
      .model_override = model_override,
      .record_path = record,
  };
  eph_run_t *run = NULL;
  if (eph_run_new(ctx, &req, &opt, &run, &err) < 0) {
    eph_request_free(&req);
    eph_store_close(store);
    eph_error("%s", err.message);
    signal_thread_stop(sigthr, sigthr_up);
    return err.code == EPH_E_INSUFFICIENT ? 4 : (err.code == EINVAL ? 2 : 1);
  }
  /* Before attaching: attaching replays the events so far (Queued) to the printer. */
  if (!json) {
    cleanup_json json_object *head = eph_run_to_json(run, false);
    json_object *req_obj = NULL, *model = NULL, *be = NULL;
    json_object_object_get_ex(head, "request", &req_obj);
    json_object_object_get_ex(req_obj, "model", &model);
    json_object_object_get_ex(head, "backend", &be);
    cleanup_free char *m = shown(json_object_get_string(model));
    /* A replayed run says so from its first line (honest replay). */
    cleanup_free char *rp = shown(replay ? model_override + strlen("replay:") : NULL);
    printf("Run %s · %s%s%s · %s\n\n", eph_run_id(run), m, replay ? " replayed from " : "",
           replay ? rp : "", json_object_get_string(be));
    fflush(stdout);
  }
  printer_t pr = {.out = stdout, .tty = isatty(STDOUT_FILENO) == 1, .quiet = quiet};
  eph_run_observer_t printer = {.on_event = json ? NULL : print_event, .opaque = &pr};
  if (eph_runstore_attach(store, run, &printer, &err) < 0) {
    eph_error("%s", err.message);
    eph_run_abandon(run, "host_error");
    eph_run_free(run);
    eph_store_close(store);
    signal_thread_stop(sigthr, sigthr_up);
    return 1;
  }
  current_run = run;
  eph_run_status_t status = eph_run_execute(run);
  current_run = NULL;
  signal_thread_stop(sigthr, sigthr_up);
  json_object *obj = eph_run_to_json(run, json);
  if (json)
    printf("%s\n", json_object_to_json_string_ext(obj, JSON_C_TO_STRING_PRETTY |
                                                           JSON_C_TO_STRING_NOSLASHESCAPE));
  else
    print_summary(stdout, obj);
  json_object_put(obj);
  eph_runstore_detach(run);
  eph_run_free(run);
  eph_store_close(store);
  return eph_run_status_exit_code(status);
}

/* ------------------------------------------------------------------ runs */

static int
runs_replay(eph_store_t *store, const char *id, double speed)
{
  eph_error_t err = {0};
  json_object *events = NULL, *run = NULL;
  if (eph_store_run_get(store, id, NULL, &run, &err) < 0) {
    eph_error("%s", err.message);
    return 1;
  }
  if (eph_store_events_since(store, id, -1, 0, &events, &err) < 0) {
    json_object_put(run);
    eph_error("%s", err.message);
    return 1;
  }
  int64_t prev = 0;
  printer_t pr = {.out = stdout, .tty = isatty(STDOUT_FILENO) == 1};
  for (size_t i = 0; i < json_object_array_length(events); i++) {
    json_object *e = json_object_array_get_idx(events, i), *v;
    int64_t t = eph_json_int64(e, "t_ms");
    if (speed > 0 && t > prev) {
      double wait = (double)(t - prev) / 1000.0 / speed;
      struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
      nanosleep(&ts, NULL);
    }
    prev = t;
    const char *src = json_object_object_get_ex(e, "source", &v) ? json_object_get_string(v) : "";
    const char *kind = json_object_object_get_ex(e, "kind", &v) ? json_object_get_string(v) : "";
    const char *text = json_object_object_get_ex(e, "text", &v) ? json_object_get_string(v) : "";
    json_object *data = json_object_object_get_ex(e, "data", &v) ? v : NULL;
    print_any(&pr, (double)t / 1000.0, src, kind, text, data);
  }
  live_close(&pr);
  print_summary(stdout, run);
  json_object_put(events);
  json_object_put(run);
  return 0;
}

/* The arguments of `runs list [--org ORG] [--limit N]`, `runs show ID` and `runs replay ID
 * [--speed N]`: a misspelt option or a bad value is an error naming it and what is
 * accepted (before: the default list came back as if asked for; atof read --speed "fast"
 * as 0, "2x" as 2). The speed bounds keep every pause of a replay a finite timespec. */
typedef enum { RUNS_LIST, RUNS_SHOW, RUNS_REPLAY } runs_sub_t;
typedef struct runs_opts {
  runs_sub_t sub;
  const char *org, *id; /* org: NULL for config `cli_org`; id: show's and replay's */
  int limit;
  double speed; /* times the original pace */
} runs_opts_t;

static int
runs_usage(void)
{
  fputs("usage: ephemeral " EPH_CLI_RUNS_USAGE "\n" EPH_CLI_RUNS_HELP, stderr);
  return 2;
}

/* -1, or 2 after the mistake and the usage. */
static int
runs_args(int argc, char **argv, runs_opts_t *o)
{
  static const struct option list_opts[] = {
      {"org", required_argument, NULL, 'o'}, {"limit", required_argument, NULL, 'n'}, {0}};
  static const struct option replay_opts[] = {{"speed", required_argument, NULL, 's'}, {0}};
  static const struct option show_opts[] = {{0}};
  *o = (runs_opts_t){.limit = 20, .speed = 1.0};
  if (argc < 2)
    return runs_usage();
  if (strcmp(argv[1], "list") == 0) {
    o->sub = RUNS_LIST;
  } else if (strcmp(argv[1], "show") == 0) {
    o->sub = RUNS_SHOW;
  } else if (strcmp(argv[1], "replay") == 0) {
    o->sub = RUNS_REPLAY;
  } else {
    eph_error("runs: unknown subcommand '%s'", argv[1]);
    return runs_usage();
  }
  const char *cmd = (const char *[]){"runs list", "runs show", "runs replay"}[o->sub];
  const struct option *opts = (const struct option *[]){list_opts, show_opts, replay_opts}[o->sub];
  int operands = o->sub == RUNS_LIST ? 0 : 1;
  argc--, argv++;
  optind = 0; /* 0: glibc re-initialises (main parsed its own options in "+" order) */
  for (int c; (c = eph_cli_getopt(cmd, argc, argv, opts)) != -1;) {
    char *end;
    errno = 0;
    if (c == 'o') {
      eph_error_t oe = {0};
      if (eph_org_name_check(optarg, &oe) < 0) {
        eph_error("runs list: --org: %s", oe.message);
        return runs_usage();
      }
      o->org = optarg;
    } else if (c == 'n') {
      long n = strtol(optarg, &end, 10);
      if (errno || *end || end == optarg || n < 1 || n > 10000) {
        eph_error("runs list: --limit '%s': a number of runs, 1..10000", optarg);
        return runs_usage();
      }
      o->limit = (int)n;
    } else if (c == 's') {
      o->speed = strtod(optarg, &end);
      if (errno || *end || end == optarg || !(o->speed >= 0.001 && o->speed <= 1000000.0)) {
        eph_error("runs replay: --speed '%s': expected a positive number, times the original "
                  "pace, within 0.001..1000000 (e.g. 1, 2.5, 10)",
                  optarg);
        return runs_usage();
      }
    } else {
      return runs_usage(); /* getopt named the option */
    }
  }
  if (argc - optind > operands) {
    eph_error("%s: unexpected argument '%s'", cmd, argv[optind + operands]);
    return runs_usage();
  }
  if (argc - optind < operands) {
    eph_error("%s: the run's ID is required", cmd);
    return runs_usage();
  }
  o->id = operands ? argv[optind] : NULL;
  if (o->id && !*o->id) {
    eph_error("%s: the run's ID is empty", cmd);
    return runs_usage();
  }
  return -1;
}

int
eph_cmd_runs_check(int argc, char **argv)
{
  runs_opts_t o;
  return runs_args(argc, argv, &o);
}

int
eph_cmd_runs(eph_ctx_t *ctx, int argc, char **argv)
{
  runs_opts_t o;
  int bad = runs_args(argc, argv, &o);
  if (bad >= 0)
    return bad;
  if (!o.org)
    o.org = eph_config_values(&ctx->config)->cli_org;
  eph_store_t *store = NULL;
  if (open_store(ctx, &store) < 0)
    return 1;
  eph_error_t err = {0};
  int status = 0;
  if (o.sub == RUNS_LIST) {
    json_object *runs = NULL;
    char *next = NULL;
    if (eph_store_run_list(store, o.org, o.limit, NULL, &runs, &next, &err) < 0) {
      eph_error("%s", err.message);
      status = 1;
    } else {
      /* Runs belong to an organisation: the CLI's own are cli_org's ("local"), a daemon's
       * are its keys' organisations. Say whose list this is, so an empty one is not a
       * mystery. */
      fprintf(stderr, "runs of organisation '%s' (--org ORG for another)\n", o.org);
      printf("%-37s %-17s %-24s %s\n", "ID", "STATUS", "CREATED", "BILLED");
      for (size_t i = 0; i < json_object_array_length(runs); i++) {
        json_object *r = json_object_array_get_idx(runs, i), *v, *usage = NULL;
        json_object_object_get_ex(r, "usage", &usage);
        time_t t = (time_t)(eph_json_int64(r, "created_at_us") / 1000000);
        struct tm tm;
        char when[32], billed[32];
        gmtime_r(&t, &tm);
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%SZ", &tm);
        printf("%-37s %-17s %-24s %s\n",
               json_object_object_get_ex(r, "id", &v) ? json_object_get_string(v) : "",
               json_object_object_get_ex(r, "status", &v) ? json_object_get_string(v) : "", when,
               eph_format_dollars(usage ? eph_json_int64(usage, "billed_micros") : 0, billed,
                                  sizeof billed));
      }
      json_object_put(runs);
      free(next);
    }
  } else if (o.sub == RUNS_SHOW) {
    /* The API's run object (what GET /v1/runs/{id} answers for it), rendered by the daemon's
     * renderer, so a script reads either the same way; not the store's row. */
    cleanup_json json_object *row = NULL, *events = NULL;
    if (eph_store_run_get(store, o.id, NULL, &row, &err) < 0 ||
        eph_store_events_since(store, o.id, -1, 0, &events, &err) < 0) {
      eph_error("%s", err.message);
      status = 1;
    } else {
      cleanup_json json_object *run = eph_run_json_from_store(row, events);
      printf("%s\n", json_object_to_json_string_ext(run, JSON_C_TO_STRING_PRETTY |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE));
    }
  } else {
    status = runs_replay(store, o.id, o.speed);
  }
  eph_store_close(store);
  return status;
}

/* ------------------------------------------------------------------ orgs, keys */

/* `orgs credit ORG MICROS`, `orgs balance ORG`: -1, or 2 after the mistake and the usage. */
typedef struct orgs_args {
  bool credit;
  const char *org;
  long long micros;
} orgs_args_t;

static int
orgs_args(int argc, char **argv, orgs_args_t *a)
{
  *a = (orgs_args_t){0};
  const char *sub = argc >= 2 ? argv[1] : NULL;
  a->credit = sub && strcmp(sub, "credit") == 0;
  bool balance = sub && strcmp(sub, "balance") == 0;
  int want = a->credit ? 4 : 3; /* orgs credit ORG MICROS, orgs balance ORG */
  bool bad = !sub || (!a->credit && !balance) || argc != want;
  if (sub && !a->credit && !balance) {
    eph_error("orgs: unknown subcommand '%s'", sub);
  } else if (sub && argc > want) {
    eph_error("orgs %s: unexpected argument '%s'", sub, argv[want]);
  } else if (!bad && a->credit) {
    char *end = NULL;
    errno = 0;
    a->micros = strtoll(argv[3], &end, 10);
    if (errno || end == argv[3] || *end || a->micros <= 0) {
      eph_error("orgs credit: MICROS '%s': a positive integer of micro-dollars (1000000 = $1)",
                argv[3]);
      bad = true;
    }
  }
  eph_error_t oe = {0};
  if (!bad && eph_org_name_check(argv[2], &oe) < 0) {
    eph_error("orgs %s: %s", sub, oe.message);
    bad = true;
  }
  if (bad) {
    fputs("usage: ephemeral " EPH_CLI_ORGS_USAGE "\n" EPH_CLI_ORGS_HELP, stderr);
    return 2;
  }
  a->org = argv[2];
  return -1;
}

int
eph_cmd_orgs_check(int argc, char **argv)
{
  orgs_args_t a;
  return orgs_args(argc, argv, &a);
}

int
eph_cmd_orgs(eph_ctx_t *ctx, int argc, char **argv)
{
  orgs_args_t a;
  int bad = orgs_args(argc, argv, &a);
  if (bad >= 0)
    return bad;
  const eph_plugin_slot_t *ledger = ledger_slot(ctx);
  if (!ledger)
    return 1;
  const eph_ledger_ops_t *ops = ledger->desc->ops;
  eph_error_t err = {0};
  const char *org = a.org;
  if (a.credit) {
    long long micros = a.micros;
    eph_store_t *store = NULL;
    if (open_store(ctx, &store) < 0)
      return 1;
    int r = eph_store_org_create(store, org, &err);
    eph_store_close(store);
    if (r < 0 || EPH_WITH_PLUGIN(ledger, ops->credit(ledger->state, org, micros, &err)) < 0) {
      eph_error("%s", err.message);
      return 1;
    }
  }
  int64_t balance = 0;
  if (EPH_WITH_PLUGIN(ledger, ops->balance(ledger->state, org, &balance, &err)) < 0) {
    eph_error("%s", err.message);
    return 1;
  }
  char buf[32];
  printf("%s balance %" PRId64 " micros (%s)\n", org, balance,
         eph_format_dollars(balance, buf, sizeof buf));
  return 0;
}

/* `keys create|revoke|list --org ORG [--name NAME] [--admin]`: -1, or 2 after the mistake
 * and the usage. */
typedef struct keys_args {
  bool create, revoke, list, admin;
  const char *org, *name;
} keys_args_t;

static int
keys_args(int argc, char **argv, keys_args_t *a)
{
  static const struct option opts[] = {{"org", required_argument, NULL, 'o'},
                                       {"name", required_argument, NULL, 'n'},
                                       {"admin", no_argument, NULL, 'a'},
                                       {0}};
  *a = (keys_args_t){0};
  bool bad = false;
  const char *sub = argc >= 2 ? argv[1] : "";
  char cmd[64];
  snprintf(cmd, sizeof cmd, "keys %s", sub);
  optind = 0; /* 0: glibc re-initialises (main parsed its own options in "+" order) */
  for (int c; argc >= 2 && (c = eph_cli_getopt(cmd, argc - 1, argv + 1, opts)) != -1;) {
    if (c == 'o')
      a->org = optarg;
    else if (c == 'n')
      a->name = optarg;
    else if (c == 'a')
      a->admin = true;
    else
      bad = true;
  }
  bool create = a->create = strcmp(sub, "create") == 0;
  bool revoke = a->revoke = strcmp(sub, "revoke") == 0;
  bool list = a->list = strcmp(sub, "list") == 0;
  const char *org = a->org, *name = a->name;
  if (!bad && argc >= 2 && !create && !revoke && !list) {
    eph_error("keys: unknown subcommand '%s'", sub);
  } else if (!bad && argc >= 2 && optind + 1 < argc) {
    eph_error("%s: unexpected argument '%s'%s", cmd, argv[optind + 1],
              revoke ? " (the key: --name NAME or --name KEY_ID)" : "");
    bad = true;
  } else if (!bad && (create || revoke || list) && (!org || ((create || revoke) && !name))) {
    eph_error("%s: %s is required", cmd, !org ? "--org ORG" : "--name NAME");
  }
  eph_error_t oe = {0};
  if (!bad && org && eph_org_name_check(org, &oe) < 0) {
    eph_error("%s: --org: %s", cmd, oe.message);
    bad = true;
  }
  if (!bad && name && !*name) {
    eph_error("%s: --name: empty", cmd);
    bad = true;
  }
  if (bad || !org || (!create && !revoke && !list) || ((create || revoke) && !name)) {
    fputs("usage: ephemeral " EPH_CLI_KEYS_USAGE "\n" EPH_CLI_KEYS_HELP, stderr);
    return 2;
  }
  return -1;
}

int
eph_cmd_keys_check(int argc, char **argv)
{
  keys_args_t a;
  return keys_args(argc, argv, &a);
}

int
eph_cmd_keys(eph_ctx_t *ctx, int argc, char **argv)
{
  keys_args_t a;
  int bad = keys_args(argc, argv, &a);
  if (bad >= 0)
    return bad;
  bool create = a.create, revoke = a.revoke, admin = a.admin;
  const char *org = a.org, *name = a.name;
  eph_store_t *store = NULL;
  if (open_store(ctx, &store) < 0)
    return 1;
  eph_error_t err = {0};
  int status = 0;
  if (create) {
    char *key = NULL, *id = NULL;
    if (eph_store_key_create(store, org, name, &key, &id, &err) < 0 ||
        (admin && eph_admin_key_mark(store, id, &err) < 0)) {
      /* An admin key that could not be marked is revoked, not left as a plain key. */
      if (id)
        eph_store_key_revoke(store, id, org, &(eph_error_t){0});
      eph_error("%s", err.message);
      status = 1;
      free(key);
      free(id);
    } else {
      /* Shown once: only its hash is stored. */
      printf("%s\n", key);
      fprintf(stderr, "created %s%s (%s) for %s; store it now, it is not shown again\n", id,
              admin ? " (admin)" : "", name, org);
      eph_free_secret(key);
      free(id);
    }
  } else if (revoke) {
    if (eph_store_key_revoke(store, name, org, &err) < 0) {
      eph_error("%s", err.message);
      status = 1;
    } else {
      printf("revoked %s\n", name);
    }
  } else {
    json_object *keys = NULL;
    if (eph_store_key_list(store, org, &keys, &err) < 0) {
      eph_error("%s", err.message);
      status = 1;
    } else {
      printf("%s\n", json_object_to_json_string_ext(keys, JSON_C_TO_STRING_PRETTY));
      json_object_put(keys);
    }
  }
  eph_store_close(store);
  return status;
}
