/* Fuzz target: the run request parser (core/request.c), the JSON body of `ephemeral run`
 * and POST /v1/runs, i.e. what any API client sends. Every accepted request is also turned
 * back into its stored form and its grants table, which walk what the parser built.
 *
 * Besides memory errors, an accepted request is checked against the input itself (parsed
 * here with json-c on its own): the body is one object with nothing but blanks after it,
 * and every string the request keeps (model, connection names and methods, file paths,
 * outputs) is the input's string byte for byte, never a silently shortened one (a
 * "\u0000" inside a JSON string would cut a C string). A violation aborts. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuzz.h"
#include "request.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz-request: accepted a request where %s is false\n", #cond);              \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* The kept string s equals JSON string v (case-insensitively for HTTP methods). */
static void
check_same(const char *s, json_object *v, bool nocase)
{
  CHECK(s != NULL && json_object_is_type(v, json_type_string));
  size_t n = (size_t)json_object_get_string_len(v);
  CHECK(strlen(s) == n);
  CHECK(nocase ? strncasecmp(s, json_object_get_string(v), n) == 0
               : memcmp(s, json_object_get_string(v), n) == 0);
}

static void
check_against_input(const uint8_t *data, size_t size, const eph_request_t *req)
{
  size_t end = size;
  while (end > 0 && strchr(" \t\r\n", data[end - 1]) && data[end - 1] != '\0')
    end--;
  CHECK(end > 0 && data[end - 1] == '}');

  json_tokener *tok = json_tokener_new();
  json_object *root = json_tokener_parse_ex(tok, (const char *)data, (int)size);
  json_tokener_free(tok);
  CHECK(root != NULL);
  json_object *v;
  if (json_object_object_get_ex(root, "model", &v))
    check_same(req->model, v, false);
  if (json_object_object_get_ex(root, "connections", &v)) {
    CHECK(req->n_connections == json_object_array_length(v));
    for (size_t i = 0; i < req->n_connections; i++) {
      json_object *c = json_object_array_get_idx(v, i), *x;
      const eph_connection_grant_t *g = &req->connections[i];
      if (json_object_is_type(c, json_type_string)) {
        check_same(g->name, c, false);
        continue;
      }
      CHECK(json_object_object_get_ex(c, "name", &x));
      check_same(g->name, x, false);
      if (json_object_object_get_ex(c, "methods", &x)) {
        CHECK(g->n_methods == json_object_array_length(x));
        for (size_t j = 0; j < g->n_methods; j++)
          check_same(g->methods[j], json_object_array_get_idx(x, j), true);
      }
    }
  }
  if (json_object_object_get_ex(root, "files", &v)) {
    CHECK(req->n_files == json_object_array_length(v));
    for (size_t i = 0; i < req->n_files; i++) {
      json_object *p;
      CHECK(json_object_object_get_ex(json_object_array_get_idx(v, i), "path", &p));
      check_same(req->files[i].path, p, false);
    }
  }
  if (json_object_object_get_ex(root, "outputs", &v)) {
    CHECK(req->n_outputs == json_object_array_length(v));
    for (size_t i = 0; i < req->n_outputs; i++)
      check_same(req->outputs[i], json_object_array_get_idx(v, i), false);
  }
  json_object_put(root);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  /* Limits small enough that the range checks are reachable from short inputs. */
  eph_request_limits_t limits = {
      .max_timeout_seconds = 900,
      .max_cost_micros = 10000000,
      .max_files_total_bytes = 4096,
      .default_model = "openai/gpt-6-luna",
  };
  eph_request_t req;
  memset(&req, 0, sizeof req);
  eph_error_t err = {0};
  const char *field = NULL;
  if (eph_request_parse((const char *)data, size, &limits, &req, &field, &err) == 0) {
    check_against_input(data, size, &req);
    CHECK(req.timeout_seconds >= 1 && req.timeout_seconds <= limits.max_timeout_seconds);
    CHECK(req.max_cost_micros >= 1 && req.max_cost_micros <= limits.max_cost_micros);
    CHECK(req.files_total_bytes <= limits.max_files_total_bytes);
    json_object *stored = eph_request_to_json(&req);
    json_object *grants = eph_request_grants(&req);
    (void)json_object_to_json_string(stored);
    (void)json_object_to_json_string(grants);
    json_object_put(stored);
    json_object_put(grants);
    eph_request_free(&req);
  } else {
    /* The failure names a field (or the body); reading it must be safe. */
    if (field)
      (void)strlen(field);
    (void)strlen(err.message);
  }
  return 0;
}
