/* The admin API of ephemerald (/v1/admin/...): API keys, credit and balance, usage and the
 * audit trail, for admin keys only (`ephemeral keys create --admin`). A key that is not an
 * admin key gets 403 permission_denied. Every call by any key on these routes, allowed or
 * not, leaves an audit record: who (key id, its organisation), what (action, target), when,
 * from which client address, and the status it got. Records older than retention_days go. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "admin.h"
#include "conf.h"
#include "loader.h"
#include "log.h"
#include "server_int.h"
#include "util.h"
#include "support/org_name.h"

#define DEFAULT_USAGE_DAYS 30

/* The client's numeric address, for the audit record. */
static void
client_address(struct MHD_Connection *c, char *out, size_t size)
{
  snprintf(out, size, "unknown");
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (!ci || !ci->client_addr)
    return;
  socklen_t len = ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                         : sizeof(struct sockaddr_in);
  if (getnameinfo(ci->client_addr, len, out, (socklen_t)size, NULL, 0, NI_NUMERICHOST) != 0)
    snprintf(out, size, "unknown");
}

/* Writes the audit record of one call, before its answer. The action has happened by then
 * (a key created, credit added): a record that cannot be written is logged as an error
 * naming the action, the key and the address, so the log holds what the table lost. */
static void
audit(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req, const char *action,
      const char *target_org, const char *target, json_object *detail, unsigned status)
{
  char addr[64];
  client_address(c, addr, sizeof addr);
  int64_t days = eph_config_values(&srv->ctx->config)->retention_days;
  eph_error_t err = {0};
  if (eph_admin_audit_add(srv->store, req->key_id ? req->key_id : "?", req->org ? req->org : "?",
                          action, target_org, target,
                          detail ? json_object_to_json_string_ext(detail, JSON_C_TO_STRING_PLAIN)
                                 : NULL,
                          addr, (int)status, (int)days, &err) < 0)
    eph_error("audit record of %s by %s from %s NOT written: %s", action,
              req->key_id ? req->key_id : "?", addr, err.message);
}

/* 0 when the caller's key is an admin key; else the 403 (audited) was answered into *r. */
static int
gate(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req, const char *action,
     const char *target_org, MHD_RESULT *r)
{
  bool admin = false;
  eph_error_t err = {0};
  if (req->key_id && eph_admin_key_is_admin(srv->store, req->key_id, &admin, &err) < 0) {
    audit(srv, c, req, action, target_org, NULL, NULL, MHD_HTTP_SERVICE_UNAVAILABLE);
    *r = eph_srv_error(c, srv, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                       err.message);
    return -1;
  }
  if (!admin) {
    audit(srv, c, req, action, target_org, NULL, NULL, MHD_HTTP_FORBIDDEN);
    *r = eph_srv_error(c, srv, MHD_HTTP_FORBIDDEN, "permission_denied", NULL,
                       "this route needs an admin key (ephemeral keys create --admin)");
    return -1;
  }
  return 0;
}

#define GATE(action, org)                                                                          \
  do {                                                                                             \
    MHD_RESULT gate_r_;                                                                            \
    if (gate(srv, c, req, (action), (org), &gate_r_) < 0)                                          \
      return gate_r_;                                                                              \
  } while (0)

/* Answers an error and audits it with its status. */
#define FAIL(action, org, target, status, type, field, ...)                                        \
  (audit(srv, c, req, (action), (org), (target), NULL, (status)),                                  \
   eph_srv_error(c, srv, (status), (type), (field), __VA_ARGS__))

/* gate() for a route naming an organisation (/v1/admin/orgs/{org}/...): the admin check,
 * then the org's syntax (eph_org_name_check; 400 naming org, audited). */
static int
gate_org(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req, const char *action,
         const char *org, MHD_RESULT *r)
{
  if (gate(srv, c, req, action, org, r) < 0)
    return -1;
  eph_error_t why = {0};
  if (eph_org_name_check(org, &why) < 0) {
    *r = FAIL(action, NULL, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "org",
              "org: " EPH_ORG_NAME_PATTERN " (%s)", why.message);
    return -1;
  }
  return 0;
}

#define GATE_ORG(action, org)                                                                      \
  do {                                                                                             \
    MHD_RESULT gate_r_;                                                                            \
    if (gate_org(srv, c, req, (action), (org), &gate_r_) < 0)                                      \
      return gate_r_;                                                                              \
  } while (0)

static json_object *
parse_body(conn_req_t *req)
{
  eph_error_t err = {0};
  json_object *o = req->body ? eph_json_parse_strict(req->body, req->body_len, &err) : NULL;
  if (o && !json_object_is_type(o, json_type_object)) {
    json_object_put(o);
    return NULL;
  }
  return o;
}

/* The first key of body not in allowed (NULL-terminated), or NULL. */
static const char *
unknown_key(json_object *body, const char *const *allowed)
{
  json_object_object_foreach(body, k, v) {
    (void)v;
    bool ok = false;
    for (const char *const *a = allowed; *a; a++)
      ok = ok || strcmp(*a, k) == 0;
    if (!ok)
      return k;
  }
  return NULL;
}

MHD_RESULT
eph_srv_admin_keys_create(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  static const char *const A = "keys.create";
  GATE(A, NULL);
  cleanup_json json_object *body = parse_body(req);
  if (!body)
    return FAIL(A, NULL, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", NULL,
                "expected a JSON object {\"org\", \"name\", \"admin\"?}");
  static const char *const allowed[] = {"org", "name", "admin", NULL};
  const char *bad = unknown_key(body, allowed);
  if (bad)
    return FAIL(A, NULL, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", bad,
                "field '%s': unknown (expected: org, name, admin)", bad);
  json_object *jo = NULL, *jn = NULL, *ja = NULL;
  json_object_object_get_ex(body, "org", &jo);
  json_object_object_get_ex(body, "name", &jn);
  json_object_object_get_ex(body, "admin", &ja);
  const char *org = json_object_is_type(jo, json_type_string) ? json_object_get_string(jo) : NULL;
  const char *name = json_object_is_type(jn, json_type_string) ? json_object_get_string(jn) : NULL;
  eph_error_t why = {0};
  if (eph_org_name_check(org, &why) < 0)
    return FAIL(A, NULL, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "org",
                "field 'org': required, a string " EPH_ORG_NAME_PATTERN " (%s)", why.message);
  if (!name || !*name || strlen(name) > 128)
    return FAIL(A, org, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "name",
                "field 'name': required, a string of 1..128 bytes");
  if (ja && !json_object_is_type(ja, json_type_boolean))
    return FAIL(A, org, name, MHD_HTTP_BAD_REQUEST, "invalid_request", "admin",
                "field 'admin': a boolean");
  bool admin = ja && json_object_get_boolean(ja);
  eph_error_t err = {0};
  cleanup_free char *key = NULL, *id = NULL;
  if (eph_store_key_create(srv->store, org, name, &key, &id, &err) < 0) {
    if (err.code == EEXIST)
      return FAIL(A, org, name, MHD_HTTP_CONFLICT, "conflict", "name", "%s", err.message);
    if (err.code == EINVAL)
      return FAIL(A, org, name, MHD_HTTP_BAD_REQUEST, "invalid_request", "name", "%s", err.message);
    return FAIL(A, org, name, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                err.message);
  }
  if (admin && eph_admin_key_mark(srv->store, id, &err) < 0) {
    eph_store_key_revoke(srv->store, id, org, &(eph_error_t){0});
    explicit_bzero(key, strlen(key));
    return FAIL(A, org, id, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                err.message);
  }
  cleanup_json json_object *detail = json_object_new_object();
  json_object_object_add(detail, "name", json_object_new_string(name));
  json_object_object_add(detail, "admin", json_object_new_boolean(admin));
  audit(srv, c, req, A, org, id, detail, MHD_HTTP_CREATED);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "object", json_object_new_string("api_key"));
  json_object_object_add(o, "id", json_object_new_string(id));
  json_object_object_add(o, "org", json_object_new_string(org));
  json_object_object_add(o, "name", json_object_new_string(name));
  json_object_object_add(o, "admin", json_object_new_boolean(admin));
  json_object_object_add(o, "key", json_object_new_string(key));
  explicit_bzero(key, strlen(key));
  return eph_srv_json(c, srv, MHD_HTTP_CREATED, o);
}

MHD_RESULT
eph_srv_admin_keys_list(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  static const char *const A = "keys.list";
  const char *org = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "org");
  GATE(A, org);
  eph_error_t why = {0};
  if (eph_org_name_check(org, &why) < 0)
    return FAIL(A, NULL, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "org",
                "org: required query parameter, " EPH_ORG_NAME_PATTERN " (%s)", why.message);
  eph_error_t err = {0};
  json_object *keys = NULL;
  if (eph_store_key_list(srv->store, org, &keys, &err) < 0)
    return FAIL(A, org, NULL, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                err.message);
  audit(srv, c, req, A, org, NULL, NULL, MHD_HTTP_OK);
  return eph_srv_json(c, srv, MHD_HTTP_OK, eph_srv_list(keys));
}

MHD_RESULT
eph_srv_admin_keys_revoke(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  static const char *const A = "keys.revoke";
  GATE(A, NULL);
  eph_error_t err = {0};
  cleanup_free char *org = NULL;
  int r = eph_admin_key_org(srv->store, req->param, &org, &err);
  if (r == 0)
    r = eph_store_key_revoke(srv->store, req->param, org, &err);
  if (r == -ENOENT)
    return FAIL(A, org, req->param, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no active key '%s'",
                req->param);
  if (r < 0)
    return FAIL(A, org, req->param, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                err.message);
  audit(srv, c, req, A, org, req->param, NULL, MHD_HTTP_OK);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string(req->param));
  json_object_object_add(o, "org", json_object_new_string(org));
  json_object_object_add(o, "revoked", json_object_new_boolean(1));
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}

/* The org's balance from the ledger plugin; credit_micros > 0 is credited first. */
static int
ledger_credit_balance(eph_server_t *srv, const char *org, int64_t credit_micros, int64_t *balance,
                      eph_error_t *err)
{
  const eph_plugin_slot_t *ledger = eph_plugins_first(&srv->ctx->plugins, EPH_KIND_LEDGER);
  const eph_ledger_ops_t *ops = ledger->desc->ops;
  *balance = 0;
  if (credit_micros > 0 &&
      EPH_WITH_PLUGIN(ledger, ops->credit(ledger->state, org, credit_micros, err)) < 0)
    return -1;
  return EPH_WITH_PLUGIN(ledger, ops->balance(ledger->state, org, balance, err)) < 0 ? -1 : 0;
}

static json_object *
balance_object(const char *org, int64_t micros)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "object", json_object_new_string("balance"));
  json_object_object_add(o, "org", json_object_new_string(org));
  json_object_object_add(o, "balance_micros", json_object_new_int64(micros));
  return o;
}

MHD_RESULT
eph_srv_admin_credit(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  static const char *const A = "orgs.credit";
  const char *org = req->param;
  GATE_ORG(A, org);
  cleanup_json json_object *body = parse_body(req);
  static const char *const allowed[] = {"amount_micros", NULL};
  const char *bad = body ? unknown_key(body, allowed) : NULL;
  if (bad)
    return FAIL(A, org, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", bad,
                "field '%s': unknown (expected: amount_micros)", bad);
  json_object *ja = NULL;
  if (!body || !json_object_object_get_ex(body, "amount_micros", &ja) ||
      !json_object_is_type(ja, json_type_int) || json_object_get_int64(ja) <= 0 ||
      json_object_get_int64(ja) >= INT64_MAX)
    return FAIL(A, org, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "amount_micros",
                "field 'amount_micros': required, a positive integer (1000000 = $1)");
  int64_t amount = json_object_get_int64(ja);
  eph_error_t err = {0};
  int64_t balance = 0;
  if (eph_store_org_create(srv->store, org, &err) < 0 ||
      ledger_credit_balance(srv, org, amount, &balance, &err) < 0)
    return FAIL(A, org, NULL, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                err.message);
  cleanup_json json_object *detail = json_object_new_object();
  json_object_object_add(detail, "amount_micros", json_object_new_int64(amount));
  json_object_object_add(detail, "balance_micros", json_object_new_int64(balance));
  audit(srv, c, req, A, org, NULL, detail, MHD_HTTP_OK);
  return eph_srv_json(c, srv, MHD_HTTP_OK, balance_object(org, balance));
}

MHD_RESULT
eph_srv_admin_balance(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  static const char *const A = "orgs.balance";
  const char *org = req->param;
  GATE_ORG(A, org);
  eph_error_t err = {0};
  int64_t balance = 0;
  if (ledger_credit_balance(srv, org, 0, &balance, &err) < 0)
    return FAIL(A, org, NULL, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                err.message);
  audit(srv, c, req, A, org, NULL, NULL, MHD_HTTP_OK);
  return eph_srv_json(c, srv, MHD_HTTP_OK, balance_object(org, balance));
}

/* A query parameter of unix microseconds; def when absent. -1 when malformed. */
static int
query_us(struct MHD_Connection *c, const char *name, int64_t def, int64_t *out)
{
  const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
  if (!v) {
    *out = def;
    return 0;
  }
  char *end = NULL;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (!*v || errno || *end || n < 0)
    return -1;
  *out = n;
  return 0;
}

MHD_RESULT
eph_srv_admin_usage(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  static const char *const A = "orgs.usage";
  const char *org = req->param;
  GATE_ORG(A, org);
  int64_t now = eph_wall_us(), from, to;
  if (query_us(c, "from_us", now - DEFAULT_USAGE_DAYS * 86400LL * 1000000, &from) < 0)
    return FAIL(A, org, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "from_us",
                "from_us: unix time in microseconds");
  if (query_us(c, "to_us", now + 1, &to) < 0 || to < from)
    return FAIL(A, org, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "to_us",
                "to_us: unix time in microseconds, not before from_us");
  eph_error_t err = {0};
  json_object *o = NULL;
  if (eph_admin_usage(srv->store, org, from, to, &o, &err) < 0)
    return FAIL(A, org, NULL, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                err.message);
  audit(srv, c, req, A, org, NULL, NULL, MHD_HTTP_OK);
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}

MHD_RESULT
eph_srv_admin_audit(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  static const char *const A = "audit.list";
  GATE(A, NULL);
  long limit;
  if (eph_srv_query_limit(c, 100, 1000, &limit) < 0)
    return FAIL(A, NULL, NULL, MHD_HTTP_BAD_REQUEST, "invalid_request", "limit",
                "limit: expected 1..1000");
  /* Recorded first, so the answer shows this very call too. */
  audit(srv, c, req, A, NULL, NULL, NULL, MHD_HTTP_OK);
  eph_error_t err = {0};
  json_object *rows = NULL;
  if (eph_admin_audit_list(srv->store, (int)limit, &rows, &err) < 0)
    return eph_srv_error(c, srv, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                         err.message);
  return eph_srv_json(c, srv, MHD_HTTP_OK, eph_srv_list(rows));
}
