/*
 * Inside the store: the table of operations each implementation (store_sqlite.c,
 * store_pg.c) fills, and the helpers they share. Not included outside core/store*.c.
 *
 * core/store.c validates every argument (ids, organisation names, lengths, hashes, limits)
 * and then calls the implementation, which may therefore assume well-formed input. An
 * implementation's struct starts with eph_store_t (its `base`), so a pointer to one is a
 * pointer to the other.
 */
#ifndef EPH_STORE_INT_H
#define EPH_STORE_INT_H

#include <pthread.h>

#include "store.h"
/* libcrypto bound on first use: eph_store_open() loads it, so an open store's code may call
 * SHA-256, CRYPTO_memcmp and OPENSSL_cleanse through the table. */
#include "support/crypto_api.h"

#define EPH_STORE_MAX_ID_BYTES 128
#define EPH_STORE_KEY_PREFIX "eph_"
#define EPH_STORE_KEY_RANDOM_BYTES 24 /* 48 hex digits: 192 bits */

typedef struct eph_store_ops {
  eph_store_kind_t kind;
  void (*close)(eph_store_t *s);
  int (*org_create)(eph_store_t *s, const char *org, eph_error_t *err);
  int (*member_add)(eph_store_t *s, const char *org, const char *member, const char *role,
                    eph_error_t *err);
  /* id and md (the key's SHA-256) are made by store.c; -EEXIST for a duplicate name. */
  int (*key_insert)(eph_store_t *s, const char *org, const char *name, const char *id,
                    const unsigned char md[32], eph_error_t *err);
  /* 0 and *id_out, *org_out (heap) for an active key whose hash is md (compared in constant
   * time), -EACCES when none. */
  int (*key_lookup)(eph_store_t *s, const unsigned char md[32], char **id_out, char **org_out,
                    eph_error_t *err);
  int (*key_revoke)(eph_store_t *s, const char *key_id_or_name, const char *org, eph_error_t *err);
  int (*key_list)(eph_store_t *s, const char *org, json_object **out, eph_error_t *err);
  /* stored: the request as it is to be stored (content already dropped under zdr). */
  int (*run_insert)(eph_store_t *s, const char *id, const char *org, const char *status,
                    int64_t created_at_us, json_object *stored, bool zdr, eph_error_t *err);
  int (*run_update)(eph_store_t *s, const char *id, const char *status, json_object *output,
                    json_object *usage, eph_error_t *err);
  /* *out NULL (and 0) when there is no such run. */
  int (*run_get)(eph_store_t *s, const char *id, json_object **out, eph_error_t *err);
  /* limit + 1 rows at most, newest first, after (after_us, after_id) when after_id. */
  int (*run_list)(eph_store_t *s, const char *org, int limit, int64_t after_us,
                  const char *after_id, json_object **out, eph_error_t *err);
  int (*event_append)(eph_store_t *s, const char *run_id, int64_t seq, int64_t t_ms,
                      const char *source, const char *kind, const char *text, json_object *data,
                      eph_error_t *err);
  int (*events_since)(eph_store_t *s, const char *run_id, int64_t since_seq, int limit,
                      json_object **out, eph_error_t *err);
  int (*idem_claim)(eph_store_t *s, const char *org, const char *key, const char *body_sha256_hex,
                    const char *new_run_id, int64_t now_us, char **existing_run_id,
                    eph_error_t *err);
  int (*idem_release)(eph_store_t *s, const char *org, const char *key, const char *run_id,
                      eph_error_t *err);
  int (*purge)(eph_store_t *s, int64_t runs_before_us, int64_t idem_before_us, eph_error_t *err);
  int (*probe)(eph_store_t *s, eph_error_t *err);
  /* Cluster operations; NULL where there is no cluster (SQLite). */
  int (*cancel_request)(eph_store_t *s, const char *run_id, eph_error_t *err);
  int (*cancels_pending)(eph_store_t *s, json_object **out, eph_error_t *err);
  int (*leases_renew)(eph_store_t *s, json_object *ids, eph_error_t *err);
  int (*leases_take_expired)(eph_store_t *s, json_object **out, eph_error_t *err);
  int (*run_take_ended)(eph_store_t *s, const char *run_id, eph_error_t *err);
  int (*queue_push)(eph_store_t *s, const char *run_id, int64_t reserved_micros, bool local_only,
                    int max_queued, eph_error_t *err);
  int (*queue_claim)(eph_store_t *s, json_object **out, eph_error_t *err);
  int (*queue_remove)(eph_store_t *s, const char *run_id, eph_error_t *err);
  int (*queue_length)(eph_store_t *s, int64_t *n, eph_error_t *err);
  /* PostgreSQL only (NULL elsewhere): eph_store_with_pg, and one statement inside it with
   * its n parameters already text (NULL: SQL NULL). */
  int (*with_pg)(eph_store_t *s, bool transaction,
                 int (*fn)(eph_store_t *s, void *opaque, eph_error_t *err), void *opaque,
                 eph_error_t *err);
  int (*pg_query)(eph_store_t *s, const char *sql, int n, const char *const *vals,
                  json_object **rows, int *changes, const char *what, eph_error_t *err);
  int (*queue_take)(eph_store_t *s, const char *run_id, json_object **out, eph_error_t *err);
  int (*listen)(eph_store_t *s, void (*fn)(void *opaque, eph_store_note_t note, const char *run_id),
                void *opaque, eph_store_listener_t **out, eph_error_t *err);
  int (*cluster_ledger)(eph_store_t *s, const char *identity, const char *plugin, const char *node,
                        json_object **out, eph_error_t *err);
  /* NULL when the implementation has no SQLite connection to lend. */
  int (*with_db)(eph_store_t *s, int (*fn)(struct sqlite3 *db, void *opaque, eph_error_t *err),
                 void *opaque, eph_error_t *err);
  /* n events of run_id in one transaction (all or none); NULL: events are written one by
   * one (event_append). The events are checked by store.c. */
  int (*events_append)(eph_store_t *s, const char *run_id, const eph_store_event_t *evs, size_t n,
                       eph_error_t *err);
} eph_store_ops_t;

/* A listener's implementation starts with this (see eph_store_listen). */
struct eph_store_listener {
  bool (*up)(eph_store_listener_t *l);
  void (*stop)(eph_store_listener_t *l);
};

struct eph_store {
  const eph_store_ops_t *ops;
  /* What messages name: the SQLite file, or the PostgreSQL target without its password. */
  char *path;
  int64_t idempotency_us;
  int schema_version; /* after the migrations at open */
  /* The last storage fault until a write succeeds again, read by health checks without
   * waiting for the implementation's lock (see eph_store_fault). */
  pthread_mutex_t fault_lock;
  char fault[512];
  /* Sticky: a damaged page (SQLite) found while serving. */
  char damaged[512];
};

/* Opens the implementations; *out is the base of the implementation's struct. */
int eph_store_sqlite_open(const char *path, const eph_store_options_t *opt, eph_store_t **out,
                          eph_error_t *err);
int eph_store_pg_open(const char *conninfo, const eph_store_options_t *opt, eph_store_t **out,
                      eph_error_t *err);

/* The SQLite schema (store_sqlite_schema.c): migration i brings PRAGMA user_version from i
 * to i + 1; append, never edit. */
extern const char *const eph_store_sqlite_migrations[];
extern const int eph_store_sqlite_schema_version;

/* The SQLite store's prepared statements (store_sqlite_schema.c), by index. */
enum {
  ST_BEGIN,
  ST_COMMIT,
  ST_ROLLBACK,
  ST_ORG_ENSURE,
  ST_ORG_EXISTS,
  ST_MEMBER_PUT,
  ST_KEY_INSERT,
  ST_KEY_BY_HASH,
  ST_KEY_REVOKE,
  ST_KEY_LIST,
  ST_RUN_INSERT,
  ST_RUN_UPDATE,
  ST_RUN_GET,
  ST_RUN_LIST_FIRST,
  ST_RUN_LIST_AFTER,
  ST_EVENT_INSERT,
  ST_EVENTS_SINCE,
  ST_IDEM_GET,
  ST_IDEM_DELETE,
  ST_IDEM_INSERT,
  ST_IDEM_RELEASE,
  ST_PURGE_RUNS,
  ST_PURGE_IDEM,
  ST_PROBE,
  ST_COUNT
};
extern const char *const eph_store_sqlite_sql[ST_COUNT];

/* The PostgreSQL schema (store_pg_schema.c): migration i brings eph_schema.version from i
 * to i + 1; append, never edit. */
extern const char *const eph_store_pg_migrations[];
extern const int eph_store_pg_schema_version;

/* Fills the base fields (path copied) / releases them. */
void eph_store_base_init(eph_store_t *s, const eph_store_ops_t *ops, const char *path,
                         int64_t idempotency_us);
void eph_store_base_free(eph_store_t *s);

/* Records a fault (damaged: sticky); logged once when the store goes from healthy to
 * failing. */
void eph_store_fault_set(eph_store_t *s, bool damaged, const char *message);
/* A write succeeded: the (non-sticky) fault is over. */
void eph_store_fault_clear(eph_store_t *s);

/* Cursor of run_list: the last row's (created_at_us, id), hex so it is opaque. */
char *eph_store_cursor_encode(int64_t created_at_us, const char *id);

#endif
