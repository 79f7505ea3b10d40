/*
 * The admin side of the store: which API keys are admin keys, the audit trail of admin
 * actions, and an organisation's usage over a period. The tables are the store's (SQLite:
 * migration 3 -> 4 in core/store_sqlite_schema.c, api_keys.admin and audit; PostgreSQL:
 * api_keys.admin since 0 -> 1 and audit since 4 -> 5 in core/store_pg_schema.c); the
 * statements are here, run through eph_store_with_db on SQLite and eph_store_with_pg on
 * PostgreSQL, where every node of a cluster reads the same marks and the same trail
 * (docs/cluster.md). Used by `ephemeral keys create --admin` and ephemerald's /v1/admin/
 * routes (core/server_admin.c).
 *
 * Errors: negative errno with err filled (-ENOENT for an unknown key, -EIO for SQLite, the
 * errors of eph_store_pg_query for PostgreSQL).
 */
#ifndef EPH_ADMIN_H
#define EPH_ADMIN_H

#include <stdbool.h>
#include <stdint.h>

#include <json-c/json.h>

#include "store.h"

/* Marks an existing key (by id) as an admin key. */
int eph_admin_key_mark(eph_store_t *store, const char *key_id, eph_error_t *err);

/* *admin = whether the active key key_id is an admin key (false for unknown/revoked). */
int eph_admin_key_is_admin(eph_store_t *store, const char *key_id, bool *admin, eph_error_t *err);

/* *org_out (heap, owned by the caller) = the organisation of the active key key_id;
 * -ENOENT when there is none. */
int eph_admin_key_org(eph_store_t *store, const char *key_id, char **org_out, eph_error_t *err);

/* One audit record: who (actor key id and its org), what (action, e.g. "keys.create"; the
 * target organisation and object, either may be NULL; detail: a short JSON text or NULL),
 * the HTTP status it got, from which client address, now. Records older than
 * retention_days (> 0) are deleted in the same transaction. */
int eph_admin_audit_add(eph_store_t *store, const char *actor_key_id, const char *actor_org,
                        const char *action, const char *target_org, const char *target,
                        const char *detail, const char *address, int status, int retention_days,
                        eph_error_t *err);

/* The newest `limit` (1..1000) audit records as a JSON array owned by the caller of
 * {"id","at_us","actor_key_id","actor_org","action","target_org"|null,"target"|null,
 * "detail"|null,"address","status"}. */
int eph_admin_audit_list(eph_store_t *store, int limit, json_object **out, eph_error_t *err);

/* Usage of org's runs created in [from_us, to_us) (unix microseconds): *out owned by the
 * caller, {"org","from_us","to_us","runs","model_micros","web_micros","compute_micros",
 * "billed_micros"} summed from the runs' usage. */
int eph_admin_usage(eph_store_t *store, const char *org, int64_t from_us, int64_t to_us,
                    json_object **out, eph_error_t *err);

#endif
