/* The PostgreSQL store's listener (eph_store_listen, docs/cluster.md): one connection of its
 * own, LISTENing on the channels the nodes announce through (eph_queue: a run was pushed
 * into the shared queue; eph_events: a run got an event; eph_cancels: a cancel was
 * requested), waited on with poll() in one thread.
 *
 * Why its own connection: the store's connection serves statements one at a time behind
 * its mutex; notifications are read from a socket that must be waited on for as long as
 * nothing happens, which would hold that mutex forever. Why a poll fallback stays with the
 * caller: NOTIFY is delivered only to sessions listening at the time of the commit, so
 * while this connection is down (a restart, a failover, a terminated backend) announcements
 * are lost; the caller polls at its old pace while eph_store_listener_up() is false, and
 * every (re)connection is announced as EPH_NOTE_RESYNC so it looks once at everything. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "store_pg_int.h"
#include "util.h"

/* After this long without traffic the connection is proved alive with a statement: a
 * server that vanished without closing the socket (a partition) is found within it plus
 * the keepalives below. */
#define LISTEN_PING_MS 10000
#define LISTEN_BACKOFF_FIRST_MS 100
#define LISTEN_BACKOFF_MAX_MS 5000

typedef struct pg_listener {
  eph_store_listener_t base; /* first: see store_int.h */
  /* The store connection's parameters (PQconninfo), NULL-terminated, with this
   * connection's application_name and timeouts; owned. */
  char **keys, **vals;
  char *display; /* the target without its password, for messages */
  void (*fn)(void *opaque, eph_store_note_t note, const char *run_id);
  void *opaque;
  int wake_fd; /* eventfd: stop() wakes the thread out of poll() */
  atomic_bool up, stop;
  bool name_checked; /* the duplicate node_name check ran (first connection only) */
  char *node;        /* this node's name, for messages; owned */
  pthread_t thread;
} pg_listener_t;

static const struct {
  const char *channel;
  eph_store_note_t note;
} channels[] = {
    {"eph_queue", EPH_NOTE_QUEUE},
    {"eph_events", EPH_NOTE_EVENTS},
    {"eph_cancels", EPH_NOTE_CANCEL},
};

/* Sleeps up to ms, or until stop() is called. */
static void
nap(pg_listener_t *l, int ms)
{
  struct pollfd p = {.fd = l->wake_fd, .events = POLLIN};
  if (!atomic_load(&l->stop))
    poll(&p, 1, ms);
}

/* The first line of the connection's last error, into buf. */
static const char *
conn_error(PGconn *c, char *buf, size_t size)
{
  snprintf(buf, size, "%s", c ? PQerrorMessage(c) : "out of memory");
  buf[strcspn(buf, "\n")] = '\0';
  return buf;
}

/* Runs the command sql on c: true, or false with why filled and c finished. */
static bool
command(PGconn *c, const char *sql, char *why, size_t size)
{
  PGresult *res = PQexec(c, sql);
  bool ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
  if (res)
    PQclear(res);
  if (!ok) {
    conn_error(c, why, size);
    PQfinish(c);
  }
  return ok;
}

/* A connection LISTENing on every channel, or NULL with why filled. */
static PGconn *
connect_listening(pg_listener_t *l, char *why, size_t size)
{
  PGconn *c = PQconnectdbParams((const char *const *)l->keys, (const char *const *)l->vals, 0);
  if (!c || PQstatus(c) != CONNECTION_OK) {
    conn_error(c, why, size);
    if (c)
      PQfinish(c);
    return NULL;
  }
  /* This session reads only the catalog: pg_catalog alone on its path (see the store's
   * eph_pg_choose_schema), so no schema the connection's path names shadows it. */
  if (!command(c, "SET search_path = pg_catalog, pg_temp", why, size))
    return NULL;
  /* Two daemons with one node_name (two on one host, both defaulting to its hostname) would
   * take each other's runs for their own after a restart: said at start. Every node's
   * listener is named "ephemeral-listen <node_name>", so another session with this name is
   * another daemon of that name (or a dead one's connection the server has not noticed yet:
   * hence a warning, not a refusal). Sessions of other roles may be hidden: then nothing.
   * Before LISTEN: the listener's last statement stays LISTEN in pg_stat_activity. */
  if (!l->name_checked) {
    l->name_checked = true;
    PGresult *dup = PQexec(c, "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                              "current_setting('application_name') AND pid <> pg_backend_pid()");
    if (dup && PQresultStatus(dup) == PGRES_TUPLES_OK && PQntuples(dup) == 1 &&
        strcmp(PQgetvalue(dup, 0, 0), "0") != 0)
      eph_warn("%s: another daemon connected to this database uses the same node_name ('%s' "
               "in pg_stat_activity): give each daemon its own (node_name, "
               "EPHEMERAL_NODE_NAME; docs/cluster.md)",
               l->display, l->node);
    if (dup)
      PQclear(dup);
  }
  return command(c, "LISTEN eph_queue; LISTEN eph_events; LISTEN eph_cancels", why, size) ? c
                                                                                          : NULL;
}

/* Hands every notification received to fn. */
static void
deliver(pg_listener_t *l, PGconn *c)
{
  PGnotify *n;
  while ((n = PQnotifies(c))) {
    for (size_t i = 0; i < sizeof channels / sizeof *channels; i++)
      if (strcmp(n->relname, channels[i].channel) == 0 && n->extra && *n->extra)
        l->fn(l->opaque, channels[i].note, n->extra);
    PQfreemem(n);
  }
}

/* Waits for notifications until the connection fails (false, why filled) or stop(). */
static bool
serve(pg_listener_t *l, PGconn *c, char *why, size_t size)
{
  while (!atomic_load(&l->stop)) {
    struct pollfd p[2] = {{.fd = PQsocket(c), .events = POLLIN},
                          {.fd = l->wake_fd, .events = POLLIN}};
    int n = poll(p, 2, LISTEN_PING_MS);
    if (n < 0 && errno != EINTR) {
      snprintf(why, size, "poll: %s", strerror(errno));
      return false;
    }
    if (atomic_load(&l->stop))
      break;
    if (n == 0) {
      /* Quiet for a while: a statement proves the server is still there (notifications
       * that arrive meanwhile are kept by libpq and delivered below). */
      PGresult *res = PQexec(c, "SELECT 1");
      bool ok = res && PQresultStatus(res) == PGRES_TUPLES_OK;
      if (res)
        PQclear(res);
      if (!ok) {
        conn_error(c, why, size);
        return false;
      }
    } else if (n > 0 && p[0].revents && !PQconsumeInput(c)) {
      conn_error(c, why, size);
      return false;
    }
    deliver(l, c);
    if (PQstatus(c) != CONNECTION_OK) {
      conn_error(c, why, size);
      return false;
    }
  }
  return true;
}

static void *
listen_main(void *arg)
{
  pg_listener_t *l = arg;
  int backoff_ms = LISTEN_BACKOFF_FIRST_MS;
  bool said_down = false, was_up = false;
  char why[400];
  while (!atomic_load(&l->stop)) {
    PGconn *c = connect_listening(l, why, sizeof why);
    if (!c) {
      if (!said_down)
        eph_warn("%s: cannot listen for other nodes' announcements (%s); polling the database "
                 "until it reconnects",
                 l->display, why);
      said_down = true;
      nap(l, backoff_ms);
      backoff_ms = backoff_ms * 2 < LISTEN_BACKOFF_MAX_MS ? backoff_ms * 2 : LISTEN_BACKOFF_MAX_MS;
      continue;
    }
    backoff_ms = LISTEN_BACKOFF_FIRST_MS;
    if (was_up || said_down)
      eph_info("%s: listening for other nodes' announcements again (backend %d)", l->display,
               PQbackendPID(c));
    else
      eph_debug("%s: listening for other nodes' announcements (backend %d)", l->display,
                PQbackendPID(c));
    said_down = false;
    was_up = true;
    atomic_store(&l->up, true);
    /* What was announced while nobody listened is lost: the caller looks at everything. */
    l->fn(l->opaque, EPH_NOTE_RESYNC, NULL);
    bool stopped = serve(l, c, why, sizeof why);
    atomic_store(&l->up, false);
    PQfinish(c);
    if (!stopped) {
      /* Whoever sleeps on the long safety poll goes back to the short one now. */
      l->fn(l->opaque, EPH_NOTE_RESYNC, NULL);
      eph_warn("%s: the listening connection was lost (%s); polling the database until it "
               "reconnects",
               l->display, why);
      said_down = true;
      nap(l, backoff_ms); /* a server refusing at once is not hammered */
    }
  }
  return NULL;
}

static bool
pg_listener_up(eph_store_listener_t *base)
{
  return atomic_load(&((pg_listener_t *)base)->up);
}

static void
listener_free(pg_listener_t *l)
{
  for (size_t i = 0; l->keys && l->keys[i]; i++) {
    free(l->keys[i]);
    if (l->vals[i])
      explicit_bzero(l->vals[i], strlen(l->vals[i])); /* a password may be among them */
    free(l->vals[i]);
  }
  free(l->keys);
  free(l->vals);
  free(l->display);
  free(l->node);
  if (l->wake_fd >= 0)
    close(l->wake_fd);
  free(l);
}

static void
pg_listener_stop(eph_store_listener_t *base)
{
  pg_listener_t *l = (pg_listener_t *)base;
  atomic_store(&l->stop, true);
  uint64_t one = 1;
  if (write(l->wake_fd, &one, sizeof one) < 0) {
    /* An eventfd write fails only at a counter near 2^64: the thread is awake anyway. */
  }
  pthread_join(l->thread, NULL);
  listener_free(l);
}

/* The listener's parameter for keyword `key` when the store's connection had none: its own
 * name (so an operator sees it in pg_stat_activity) and bounded waits. */
static const char *
own_value(const char *key)
{
  if (strcmp(key, "connect_timeout") == 0)
    return "5";
  if (strcmp(key, "keepalives") == 0)
    return "1";
  if (strcmp(key, "keepalives_idle") == 0)
    return "10";
  if (strcmp(key, "keepalives_interval") == 0)
    return "5";
  if (strcmp(key, "keepalives_count") == 0)
    return "3";
  return NULL;
}

int
eph_pg_listen(eph_store_t *base,
              void (*fn)(void *opaque, eph_store_note_t note, const char *run_id), void *opaque,
              eph_store_listener_t **out, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  pg_listener_t *l = eph_xcalloc(1, sizeof *l);
  l->base = (eph_store_listener_t){.up = pg_listener_up, .stop = pg_listener_stop};
  l->fn = fn;
  l->opaque = opaque;
  l->display = eph_xstrdup(base->path);
  l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->wake_fd < 0) {
    int e = errno;
    listener_free(l);
    return eph_error_set(err, e, "listening: eventfd: %s", strerror(e));
  }
  /* The same server, database, user and credentials as the store's connection. */
  pthread_mutex_lock(&s->lock);
  PQconninfoOption *opts = PQconninfo(s->conn);
  pthread_mutex_unlock(&s->lock);
  if (!opts) {
    listener_free(l);
    return eph_error_set(err, ENOMEM, "%s: listening: no connection parameters", base->path);
  }
  size_t n = 0;
  for (PQconninfoOption *o = opts; o->keyword; o++)
    n++;
  l->keys = eph_xcalloc(n + 2, sizeof *l->keys);
  l->vals = eph_xcalloc(n + 2, sizeof *l->vals);
  size_t k = 0;
  for (PQconninfoOption *o = opts; o->keyword; o++) {
    const char *v = o->val && *o->val ? o->val : own_value(o->keyword);
    if (!v || strcmp(o->keyword, "application_name") == 0)
      continue;
    l->keys[k] = eph_xstrdup(o->keyword);
    l->vals[k++] = eph_xstrdup(v);
  }
  PQconninfoFree(opts);
  l->keys[k] = eph_xstrdup("application_name");
  l->node = eph_xstrdup(s->node ? s->node : "(no node)");
  l->vals[k++] = eph_xasprintf("ephemeral-listen %s", l->node);
  int r = pthread_create(&l->thread, NULL, listen_main, l);
  if (r != 0) {
    listener_free(l);
    return eph_error_set(err, r, "listening: starting its thread: %s", strerror(r));
  }
  *out = &l->base;
  return 0;
}
