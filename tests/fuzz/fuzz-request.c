/* Fuzz target: the run request parser (core/request.c), the JSON body of `ephemeral run`
 * and POST /v1/runs, i.e. what any API client sends. Every accepted request is also turned
 * back into its stored form and its grants table, which walk what the parser built. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "request.h"

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
