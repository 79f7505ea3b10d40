/*
 * The store: run history, organisations, members, API keys and idempotency keys, used by
 * the run engine and the HTTP daemon. Two implementations behind one interface, chosen by
 * what eph_store_open is given:
 *   - a path: one SQLite file (<state_dir>/ephemeral.sqlite), the default, one host
 *     (core/store_sqlite.c; described below);
 *   - a PostgreSQL URI ("postgresql://..." or "postgres://...") or a libpq key=value
 *     connection string ("host=... dbname=..."): a database several hosts share
 *     (core/store_pg.c, docs/cluster.md), built when libpq was found at configure time.
 * Both keep the same contract (same errors, same JSON shapes, same ZDR rules).
 *
 * PostgreSQL: one connection behind a mutex, reset once and retried when the server closed
 * it. The schema is versioned in table eph_schema and migrated under
 * pg_advisory_xact_lock, so several nodes starting at once migrate exactly once; a schema
 * newer than this code is refused (-EPH_E_CONFIG). Read-then-write operations are single
 * statements or one transaction whose conflicting inserts are decided by the unique index
 * (INSERT ... ON CONFLICT), so two nodes claiming one idempotency key get one winner.
 * Every value is a bound parameter (PQexecParams); no SQL is built from data. The
 * connection string's password never appears in a message (eph_store_path shows the
 * target without it).
 *
 * SQLite file: WAL mode, synchronous=NORMAL (history, not money: an OS crash may lose the last
 * events, never corrupt the file; the money is in the ledger plugin's own file), foreign
 * keys on, busy_timeout 5 s for a second process (CLI beside the daemon). The schema is
 * versioned with PRAGMA user_version and migrated forward at open; a file newer than this
 * code is refused (-EPH_E_CONFIG). The file is created mode 0600. A damaged file (PRAGMA
 * quick_check at open) is refused with -EIO naming it.
 *
 * Threads: one eph_store_t may be used from any number of threads. It holds one connection
 * behind a mutex: SQLite admits one writer at a time anyway, every call is a few indexed
 * prepared statements (microseconds), and one connection means the idempotency claim and the
 * key checks need no retry loop on SQLITE_BUSY inside the process. Writes that read then
 * write run in one BEGIN IMMEDIATE transaction, so they are atomic against other processes
 * too. No SQL is built from user data: every value is bound to a prepared statement.
 *
 * Zero data retention (ZDR): a run inserted with zdr set keeps ids, status, timings and
 * usage only. The store drops, whatever the caller passes: the request's content (every
 * top-level string, object or array except "model" and "connections"; booleans and
 * numbers, i.e. the permission table, budget and timeout, stay), the run's output, and
 * every event's `data` payload. Event `text` is stored as given: the caller redacts it.
 *
 * Errors: negative errno or -EPH_E_* with err filled, messages naming the file. -EBUSY when
 * another process held the write lock past the timeout (and, documented below, for an
 * idempotency conflict), -ENOENT for an unknown id, -EINVAL for a bad argument.
 */
#ifndef EPH_STORE_H
#define EPH_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#include <ephemeral/plugin.h>

typedef struct eph_store eph_store_t;

typedef enum eph_store_kind { EPH_STORE_SQLITE, EPH_STORE_POSTGRES } eph_store_kind_t;

/* True when target names a PostgreSQL database (a postgresql:// or postgres:// URI, or a
 * libpq key=value string), false for a file path. */
bool eph_store_target_is_pg(const char *target);

/* Store options; a NULL pointer or a 0 field takes the default. */
typedef struct eph_store_options {
  /* How long an idempotency key is remembered, hours. Default 24; values below 24 are
   * refused (-EINVAL): clients retry for up to a day (Stripe's convention). */
  int idempotency_hours;
  /* How long another process may hold the write lock before a call fails, ms. Default 5000. */
  int busy_timeout_ms;
  /* PostgreSQL only: an SQLite file lent by eph_store_with_db (node-local tables). The
   * core's webhooks and admin audit no longer use it: they are in PostgreSQL
   * (eph_store_with_pg). NULL: eph_store_with_db fails with -ENOTSUP. */
  const char *local_path;
  /* PostgreSQL only: this node's name and lease (docs/cluster.md). A run inserted by this
   * store carries node_name and a lease of lease_seconds, renewed with
   * eph_store_leases_renew; NULL/0: runs get no lease (the CLI, tests). */
  const char *node_name;
  int lease_seconds;
  /* SQLite only: PRAGMA quick_check the whole file at open whatever its size (the daemon
   * at start, `ephemeral doctor`). false: a file past EPH_SQLITE_CHECK_WHOLE_MAX_BYTES has
   * only its keys, organisations and members checked (sdk/support/sqlite.h), so a CLI
   * command stays fast as history grows. */
  bool check_whole;
} eph_store_options_t;

/* Opens (creating or migrating) the store at path: an SQLite file, or a PostgreSQL
 * connection string (see the top comment; -EPH_E_CONFIG when this build has no libpq).
 * *out is owned by the caller and released with eph_store_close(). */
int eph_store_open(const char *path, const eph_store_options_t *opt, eph_store_t **out,
                   eph_error_t *err);
void eph_store_close(eph_store_t *store);

/* Lowercase hex SHA-256 of bytes (OpenSSL EVP) into out (65 bytes with the NUL): the
 * idempotency body hash. Returns 0 or -EIO. */
int eph_sha256_hex(const void *data, size_t bytes, char out[65], eph_error_t *err);

/* ---------------------------------------------------------------- organisations, members */

/* Creates an organisation; already existing is success. Every function here taking an org
 * refuses (-EINVAL) a name outside the one rule, eph_org_name_check (support/org_name.h:
 * [A-Za-z0-9_.-]{1,64}). */
int eph_store_org_create(eph_store_t *store, const char *org, eph_error_t *err);

/* Adds (or updates the role of) a member of an existing organisation. role: "owner",
 * "admin" or "member". -ENOENT when the organisation does not exist. */
int eph_store_member_add(eph_store_t *store, const char *org, const char *member, const char *role,
                         eph_error_t *err);

/* ---------------------------------------------------------------- API keys */

/* Creates an API key for org (created if new) named `name` (unique among the org's active
 * keys, else -EEXIST). *key_out receives the key, "eph_" + 48 hex digits (24 random
 * bytes), heap-allocated and owned by the caller (free()): it is shown once, only its
 * SHA-256 is stored. *key_id_out (optional, may be NULL) receives the key's id
 * "key_" + 16 hex, owned by the caller. */
int eph_store_key_create(eph_store_t *store, const char *org, const char *name, char **key_out,
                         char **key_id_out, eph_error_t *err);

/* Checks a presented key. On success *org_out and *key_id_out (each optional) receive heap
 * strings owned by the caller. -EACCES for an unknown, malformed or revoked key (the same
 * error for all three). The key's SHA-256 is looked up by index and then compared with
 * CRYPTO_memcmp (constant time); the index walk depends only on the hash, which reveals
 * nothing usable about the key. */
int eph_store_key_verify(eph_store_t *store, const char *key, char **org_out, char **key_id_out,
                         eph_error_t *err);

/* Revokes the org's active key whose id or name is key_id_or_name. -ENOENT when there is
 * none (unknown, other organisation's, or already revoked). */
int eph_store_key_revoke(eph_store_t *store, const char *key_id_or_name, const char *org,
                         eph_error_t *err);

/* Lists the org's keys, newest first, revoked ones included: *out is a JSON array owned by
 * the caller (json_object_put) of {"id","name","created_at_us","revoked_at_us"|null}.
 * Never the key or its hash. */
int eph_store_key_list(eph_store_t *store, const char *org, json_object **out, eph_error_t *err);

/* ---------------------------------------------------------------- runs */

/* Inserts a run. id: "run_" + 32 hex (any unique string up to 128 bytes is accepted);
 * created_at_us: CLOCK_REALTIME micros; request: the validated request object (borrowed;
 * copied, minus content under zdr, see the top comment). -EEXIST when id exists. */
int eph_store_run_insert(eph_store_t *store, const char *id, const char *org, const char *status,
                         int64_t created_at_us, json_object *request, bool zdr, eph_error_t *err);

/* Updates a run: any of status, output, usage may be NULL to leave it unchanged (output is
 * never stored under zdr). The objects are borrowed. -ENOENT for an unknown run.
 * -ESTALE, nothing written, when the store is a cluster node's (PostgreSQL with a node_name)
 * and another node holds the run (the row's `node`): this node's lease expired and that
 * node took the run over, so this node's view of it is stale (docs/cluster.md). A row held
 * by no node (waiting in the shared queue) or a store without a node_name (the CLI) is
 * written as before. */
int eph_store_run_update(eph_store_t *store, const char *id, const char *status,
                         json_object *output, json_object *usage, eph_error_t *err);

/* One run as a JSON object owned by the caller: {"id","org","status","created_at_us",
 * "updated_at_us","zero_data_retention","request","output"|null,"usage"|null}.
 * org, when non-NULL, must match (else -ENOENT: another organisation's run does not exist
 * for the caller). */
int eph_store_run_get(eph_store_t *store, const char *id, const char *org, json_object **out,
                      eph_error_t *err);

/* Lists an organisation's runs, newest first (created_at_us desc, id desc), at most limit
 * (1..1000; 0 means 50). cursor: NULL for the first page, else a next_cursor returned
 * before (-EINVAL when malformed). *runs_out: JSON array of run objects (as run_get, without
 * "request" and "output"), owned by the caller. *next_cursor: heap string owned by the
 * caller, or NULL when this was the last page. Keyset pagination: a page never repeats or
 * skips a run even when runs are inserted meanwhile. */
int eph_store_run_list(eph_store_t *store, const char *org, int limit, const char *cursor,
                       json_object **runs_out, char **next_cursor, eph_error_t *err);

/* ---------------------------------------------------------------- events */

/* Appends one timeline event of a run: seq (>= 0, unique per run, else -EEXIST), t_ms
 * (milliseconds since the run was queued), source ("Shell"), kind ("tool_call"), text (one
 * line), data (optional JSON, borrowed; not stored under zdr). -ENOENT for an unknown run;
 * -ESTALE when another node holds it (as eph_store_run_update). */
int eph_store_event_append(eph_store_t *store, const char *run_id, int64_t seq, int64_t t_ms,
                           const char *source, const char *kind, const char *text,
                           json_object *data, eph_error_t *err);

/* One event of eph_store_events_append: the arguments of eph_store_event_append. */
typedef struct eph_store_event {
  int64_t seq, t_ms;
  const char *source, *kind, *text; /* text may be NULL (stored empty) */
  const char *data_json;            /* data serialised (JSON text), NULL: none */
} eph_store_event_t;

/* Appends n >= 1 events of run_id (each checked as eph_store_event_append checks it) in
 * one transaction: all of them or, on any error, none. -ENOTSUP when the store writes
 * events one by one (eph_store_groups_events() false: PostgreSQL announces each event to
 * the cluster as it is stored). */
int eph_store_events_append(eph_store_t *store, const char *run_id, const eph_store_event_t *evs,
                            size_t n, eph_error_t *err);

/* Whether eph_store_events_append is implemented (SQLite: one commit for many events is
 * what makes a shell call cheap; PostgreSQL: no). */
bool eph_store_groups_events(const eph_store_t *store);

/* Events of a run with seq > since_seq in seq order (since_seq = -1: from the start), at
 * most limit (0 = all): the SSE resume point is Last-Event-ID. *out: JSON array owned by the
 * caller of {"seq","t_ms","source","kind","text","data"?}. An unknown run gives an empty
 * array. */
int eph_store_events_since(eph_store_t *store, const char *run_id, int64_t since_seq, int limit,
                           json_object **out, eph_error_t *err);

/* ---------------------------------------------------------------- idempotency */

/* Atomically claims the idempotency key `key` of org for a request whose body hashes to
 * body_sha256_hex (eph_sha256_hex of the raw body) and which would become run new_run_id.
 * Returns:
 *   0       claimed: the caller owns the key and creates new_run_id;
 *   1       the same key with the same body was claimed before: *existing_run_id (heap,
 *           owned by the caller) is that run; answer with it, create nothing;
 *   -EBUSY  the same key was used with a different body (HTTP 422/409 in the API); err
 *           says so; nothing claimed.
 * A key older than idempotency_hours is forgotten and may be claimed again. */
int eph_store_idem_claim(eph_store_t *store, const char *org, const char *key,
                         const char *body_sha256_hex, const char *new_run_id,
                         char **existing_run_id, eph_error_t *err);

/* Forgets the claim of `key` by org, but only while it still names run_id: the daemon calls
 * it when the request that claimed the key is refused after the claim (insufficient
 * balance, full queue), so a retry is judged afresh instead of pointing at a run that was
 * never created. Releasing a claim that is gone or names another run is a no-op (0). */
int eph_store_idem_release(eph_store_t *store, const char *org, const char *key, const char *run_id,
                           eph_error_t *err);

/* ---------------------------------------------------------------- retention */

/* Deletes runs created more than retention_days ago (> 0) with their events, and
 * idempotency keys older than idempotency_hours. Returns the number of runs deleted. */
int eph_store_purge(eph_store_t *store, int retention_days, eph_error_t *err);

/* ---------------------------------------------------------------- health */

/* Proves the store can commit right now: one tiny write transaction outside history.
 * 0, or the error a run's write would get (-ENOSPC on a full disk, -EIO, -EBUSY). */
int eph_store_probe(eph_store_t *store, eph_error_t *err);

/* True while the store is failing: the last write hit a fault of the file or the disk
 * (full, I/O error) and none has succeeded since, or any operation found a damaged page
 * (sticky: only reopening, which runs quick_check, clears it). buf (optional) receives
 * the message naming the file. Never waits for a write in progress. */
bool eph_store_fault(eph_store_t *store, char *buf, size_t size);

/* ---------------------------------------------------------------- cluster */

/* Asks the node executing run_id to cancel it (PostgreSQL: the run may be live on another
 * node; SQLite: -ENOTSUP, one host cancels in memory). Idempotent. -ENOENT for an unknown
 * run. The owner finds the request with eph_store_cancels_pending. */
int eph_store_cancel_request(eph_store_t *store, const char *run_id, eph_error_t *err);

/* The ids of runs with a cancel request that are still queued or running: *out is a JSON
 * array of strings owned by the caller. -ENOTSUP on SQLite. */
int eph_store_cancels_pending(eph_store_t *store, json_object **out, eph_error_t *err);

/* Renews this node's lease on its runs: ids is a JSON array of run id strings (borrowed),
 * each given lease_seconds from now if it is this node's and still queued or running.
 * -ENOTSUP on SQLite or without a node_name. */
int eph_store_leases_renew(eph_store_t *store, json_object *ids, eph_error_t *err);

/* Takes over every queued or running run whose lease expired (its node stopped renewing
 * it): one conditional UPDATE gives each such run a fresh lease held by this node, so of
 * several nodes noticing at once exactly one gets it. *out: JSON array of the run ids
 * taken, owned by the caller; the caller settles and ends them (host_lost). -ENOTSUP on
 * SQLite or without a node_name. */
int eph_store_leases_take_expired(eph_store_t *store, json_object **out, eph_error_t *err);

/* Makes this node the holder of run_id when the run has ended (neither queued nor running)
 * and its row names another node: for a node completing an ended run's record on behalf of
 * its node (cluster_orphans.c: the run ended, its settle failed, its node may be gone).
 * From then on the old holder's writes to the run are refused (-ESTALE). 1 when taken, 0
 * when not (queued or running: the lease takeover's; unknown; already this node's).
 * -ENOTSUP on SQLite or without a node_name. */
int eph_store_run_take_ended(eph_store_t *store, const char *run_id, eph_error_t *err);

/* The ledger every node of a cluster must share (docs/cluster.md). With identity (the
 * ledger's eph_ledger_ops_t.identity), plugin (its name) and node (this node's name): records
 * them as the cluster's ledger when none is recorded yet (the first node to ask wins; nodes
 * asking at once are decided by the one-row table's key). identity NULL: only reads. Then
 * *out is what is recorded, {"identity", "plugin", "node", "recorded_at_us"} owned by the
 * caller, or NULL when nothing is. -ENOTSUP on SQLite (one host: no cluster to share). */
int eph_store_cluster_ledger(eph_store_t *store, const char *identity, const char *plugin,
                             const char *node, json_object **out, eph_error_t *err);

/* The shared run queue (PostgreSQL, docs/cluster.md; SQLite: -ENOTSUP, one host queues in
 * memory). A run is pushed by the node that admitted it (its row inserted, status queued,
 * its budget reserved in the ledger) and claimed by whichever node has a free worker first.
 *
 * Pushes run_id with the reservation the admitting node made (reserved_micros, recorded so
 * the claimer executes with it and never reserves again). local_only: only this node may
 * claim it (zero data retention: the request's content exists only in this node's memory),
 * and the run keeps this node's lease (if this node dies, the lease takeover ends it
 * host_lost). Otherwise the run's row gives up its node and lease while it waits: a queued
 * run belongs to no node, so a node dying leaves it claimable by the others. 0 when queued;
 * -EAGAIN when the shared queue already holds max_queued runs (checked and counted in one
 * statement: nodes pushing at once never exceed it); -ENOENT when run_id has no queued row. */
int eph_store_queue_push(eph_store_t *store, const char *run_id, int64_t reserved_micros,
                         bool local_only, int max_queued, eph_error_t *err);

/* Claims the oldest queued run this node may take (skipping rows another node is claiming:
 * FOR UPDATE SKIP LOCKED), removes it from the queue and gives its row this node's name and
 * a fresh lease, in one statement. *out: NULL when there is none, else an object owned by
 * the caller: {"id", "org", "request" (the stored request), "zdr", "created_at_us",
 * "reserved_micros", "local_only"}. -ENOTSUP on SQLite or without a node_name. */
int eph_store_queue_claim(eph_store_t *store, json_object **out, eph_error_t *err);

/* Takes run_id out of the queue (a cancel of a queued run): 1 when it was queued (no node
 * will claim it now), 0 when it was not (already claimed, or never queued). */
int eph_store_queue_remove(eph_store_t *store, const char *run_id, eph_error_t *err);

/* How many runs wait in the shared queue (the number the bound is checked against). */
int eph_store_queue_length(eph_store_t *store, int64_t *n, eph_error_t *err);

/* Takes run_id out of the shared queue for a cancel (PostgreSQL): deletes its queue row
 * (one not local_only) and gives the run this node's name and a fresh lease, in one
 * statement, as eph_store_queue_claim does for the oldest run. A claim running at the same
 * moment holds the row's lock: this waits for it and then finds the row gone, so exactly
 * one of the claim and the take gets the run. *out: NULL when the run was not in the
 * queue (claimed, ended, a zero-data-retention run another node holds, or never queued),
 * else the object eph_store_queue_claim gives, owned by the caller; the caller ends the
 * run (it never runs). -ENOTSUP on SQLite or without a node_name. */
int eph_store_queue_take(eph_store_t *store, const char *run_id, json_object **out,
                         eph_error_t *err);

/* What another node announced (PostgreSQL NOTIFY, delivered to eph_store_listen's fn). */
typedef enum eph_store_note {
  EPH_NOTE_QUEUE,  /* run_id was pushed into the shared queue (channel eph_queue) */
  EPH_NOTE_EVENTS, /* run_id got a new event (channel eph_events) */
  EPH_NOTE_CANCEL, /* a cancel of run_id was requested (channel eph_cancels) */
  /* The listener (re)connected, or lost its connection (run_id NULL): notifications sent
   * while it was down are lost, so anything may have happened: look at the queue, the
   * cancels and the followed runs now, and choose the poll interval again
   * (eph_store_listener_up). */
  EPH_NOTE_RESYNC,
} eph_store_note_t;

typedef struct eph_store_listener eph_store_listener_t;

/* Listens for the cluster's announcements (PostgreSQL LISTEN) on a connection of its own
 * (never the store's, which serves statements behind its mutex), in one thread that waits
 * on the connection's socket. fn(opaque, note, run_id) is called from that thread for
 * every notification (run_id borrowed for the call); it must be quick and must not stop
 * the listener. A lost connection is reconnected with a backoff (0.1 s doubling to 5 s);
 * each successful connection (the first included) and each loss is announced with
 * EPH_NOTE_RESYNC. While
 * it is down, eph_store_listener_up() is false: the caller polls as it would without it.
 * application_name of the connection: "ephemeral-listen <node_name>". The listener does not
 * keep the store alive: stop it before closing the store. -ENOTSUP on SQLite (one host
 * has nothing to listen to). *out owned by the caller, released with
 * eph_store_listener_stop. */
int eph_store_listen(eph_store_t *store,
                     void (*fn)(void *opaque, eph_store_note_t note, const char *run_id),
                     void *opaque, eph_store_listener_t **out, eph_error_t *err);

/* True while the listener's connection is up and LISTENing (notifications arrive). */
bool eph_store_listener_up(eph_store_listener_t *l);

/* Stops the thread (waiting for a connection attempt in progress, at most its
 * connect_timeout) and closes the connection; l may be NULL. */
void eph_store_listener_stop(eph_store_listener_t *l);

/* ---------------------------------------------------------------- other modules' tables */

/* Runs fn(db, opaque, err) holding the store's lock (the one connection, see the top
 * comment), for a module that keeps its own tables in this file (core/webhook.c: the
 * migration creating them is here, the statements there). fn must not call back into the
 * store. Returns what fn returned. On PostgreSQL: fn runs on the node-local SQLite file
 * named by eph_store_options_t.local_path, or the call fails with -ENOTSUP when none was
 * given; the core's own modules use eph_store_with_pg there instead (their tables are
 * shared by the cluster, docs/cluster.md). */
struct sqlite3;
int eph_store_with_db(eph_store_t *store,
                      int (*fn)(struct sqlite3 *db, void *opaque, eph_error_t *err), void *opaque,
                      eph_error_t *err);

/* The PostgreSQL counterpart of eph_store_with_db, for the same modules' tables when they
 * are shared by a cluster (admin keys and audit in core/admin.c, webhooks and their
 * deliveries in core/webhook_queue.c; the migration creating them is in
 * core/store_pg_schema.c): runs fn(store, opaque, err) holding the store's one connection
 * (so fn must not call any other eph_store_* function than eph_store_pg_query), inside one
 * transaction when `transaction` (committed when fn returns >= 0, rolled back otherwise).
 * Returns what fn returned, or the COMMIT's error. -ENOTSUP on SQLite (use
 * eph_store_with_db there). */
int eph_store_with_pg(eph_store_t *store, bool transaction,
                      int (*fn)(eph_store_t *store, void *opaque, eph_error_t *err), void *opaque,
                      eph_error_t *err);

/* One statement, only inside eph_store_with_pg's fn. Parameters $1, $2, ... are bound from
 * the arguments, one letter of `types` each (as eph_sqlrow_prepare): 't' a const char *
 * (NULL: SQL NULL), 'i' an int64_t, 'n' an int64_t bound as NULL when it is not positive.
 * rows (optional): a new JSON array owned by the caller, one object per row keyed by the
 * column names: SQL NULL as null, integer columns (int2/4/8) as int64, boolean as boolean,
 * anything else as its text. changes (optional): the rows the statement affected. what
 * names the operation in messages. 0, or -EEXIST (a unique index), -EINVAL (a constraint),
 * -EBUSY (a lock or serialisation conflict), -EIO, with err naming the database. */
int eph_store_pg_query(eph_store_t *store, json_object **rows, int *changes, const char *what,
                       eph_error_t *err, const char *sql, const char *types, ...);

/* The file's path, or the PostgreSQL target without its password (borrowed, lives as long
 * as the store). */
const char *eph_store_path(const eph_store_t *store);

/* The schema version the store is at (its migrations applied at open). */
int eph_store_schema_version(const eph_store_t *store);

/* Which implementation the store is. */
eph_store_kind_t eph_store_kind(const eph_store_t *store);

#endif
