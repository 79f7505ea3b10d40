/* The PostgreSQL store's record of the ledger a cluster's nodes share (store.h's
 * eph_store_cluster_ledger, docs/cluster.md). */
#include "config.h"

#include <errno.h>

#include "store_pg_int.h"
#include "util.h"

int
eph_pg_cluster_ledger(eph_store_t *base, const char *identity, const char *plugin, const char *node,
                      json_object **out, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  int r = 0;
  if (identity) {
    i64s_t now = i64s(eph_wall_us());
    const char *v[] = {identity, plugin, node, now.s};
    /* The first node wins: one row, keyed by a constant. Its own statement (autocommit), so
     * the read below takes a new snapshot and sees the winner when another node inserted
     * it at the same moment. */
    cleanup_pgresult PGresult *ins =
        eph_pg_run(s,
                   "INSERT INTO cluster_ledger(identity, plugin, node, recorded_at_us)"
                   " VALUES ($1, $2, $3, $4) ON CONFLICT (one) DO NOTHING",
                   4, v, "recording the cluster's ledger", &r, err);
    if (r < 0)
      return r;
  }
  cleanup_pgresult PGresult *res =
      eph_pg_run(s, "SELECT identity, plugin, node, recorded_at_us FROM cluster_ledger", 0, NULL,
                 "reading the cluster's ledger", &r, err);
  if (r < 0)
    return r;
  if (PQntuples(res) == 1) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "identity", json_object_new_string(PQgetvalue(res, 0, 0)));
    json_object_object_add(o, "plugin", json_object_new_string(PQgetvalue(res, 0, 1)));
    json_object_object_add(o, "node", json_object_new_string(PQgetvalue(res, 0, 2)));
    json_object_object_add(o, "recorded_at_us", json_object_new_int64(get_i64(res, 0, 3)));
    *out = o;
  }
  return 0;
}
