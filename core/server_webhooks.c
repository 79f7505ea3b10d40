/* The webhook routes of ephemerald: register, list and delete an organisation's endpoints,
 * read its deliveries. The delivery itself is core/webhook.c. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"
#include "util.h"
#include "webhook.h"

static MHD_RESULT
failure(eph_server_t *srv, struct MHD_Connection *c, const eph_error_t *err)
{
  return eph_srv_error(c, srv, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL, "%s",
                       err->message);
}

MHD_RESULT
eph_srv_webhooks_create(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  eph_error_t perr = {0};
  cleanup_json json_object *body =
      req->body ? eph_json_parse_strict(req->body, req->body_len, &perr) : NULL;
  json_object *url = NULL;
  if (!json_object_is_type(body, json_type_object))
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", NULL,
                         "expected a JSON object {\"url\": \"https://...\"}");
  json_object_object_foreach(body, k, v) {
    (void)v;
    if (strcmp(k, "url") != 0)
      return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", k,
                           "field '%s': unknown (expected: url)", k);
  }
  if (!json_object_object_get_ex(body, "url", &url) || !json_object_is_type(url, json_type_string))
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "url",
                         "field 'url': required, a string");
  eph_error_t err = {0};
  const char *field = NULL;
  json_object *out = NULL;
  if (eph_webhooks_register(srv->webhooks, req->org, json_object_get_string(url), &out, &field,
                            &err) < 0) {
    if (field)
      return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", field, "%s",
                           err.message);
    return failure(srv, c, &err);
  }
  return eph_srv_json(c, srv, MHD_HTTP_CREATED, out);
}

MHD_RESULT
eph_srv_webhooks_list(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  eph_error_t err = {0};
  json_object *data = NULL;
  if (eph_webhooks_list(srv->webhooks, req->org, &data, &err) < 0)
    return failure(srv, c, &err);
  return eph_srv_json(c, srv, MHD_HTTP_OK, eph_srv_list(data));
}

MHD_RESULT
eph_srv_webhooks_delete(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  eph_error_t err = {0};
  if (eph_webhooks_delete(srv->webhooks, req->org, req->param, &err) < 0) {
    if (err.code == ENOENT)
      return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no webhook '%s'",
                           req->param);
    return failure(srv, c, &err);
  }
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string(req->param));
  json_object_object_add(o, "deleted", json_object_new_boolean(1));
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}

MHD_RESULT
eph_srv_webhooks_deliveries(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  long limit;
  if (eph_srv_query_limit(c, 50, 500, &limit) < 0)
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "limit",
                         "limit: expected 1..500");
  eph_error_t err = {0};
  json_object *data = NULL;
  if (eph_webhooks_deliveries(srv->webhooks, req->org, (int)limit, &data, &err) < 0)
    return failure(srv, c, &err);
  return eph_srv_json(c, srv, MHD_HTTP_OK, eph_srv_list(data));
}

MHD_RESULT
eph_srv_webhooks_secret(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  eph_error_t err = {0};
  cleanup_free char *secret = NULL;
  if (eph_webhooks_default_secret(srv->webhooks, req->org, &secret, &err) < 0)
    return failure(srv, c, &err);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "object", json_object_new_string("webhook_secret"));
  json_object_object_add(o, "secret", json_object_new_string(secret));
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}
