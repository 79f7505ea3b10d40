/* Request v1: the JSON body of `ephemeral run REQUEST.json` and `POST /v1/runs`.
 *
 *   { "prompt": string (required, 1 byte .. 1 MiB),
 *     "model": string (optional; default from config `default_model`),
 *     "shell": bool, "web": bool (default false: anything not listed is not available),
 *     "files": [ {"path": string, "content": string, "encoding": "utf-8"|"base64"} ]
 *              (inline input files placed in scratch; their presence grants the file tools),
 *     "connections": [ "name" | {"name": string, "methods": [string]} ],
 *     "outputs": [ string ]   (paths in scratch returned with the run's output),
 *     "timeout_seconds": integer 1..max_timeout_seconds (required),
 *     "max_cost_micros": integer 1..max_cost_micros (required; the hard budget cap),
 *     "zero_data_retention": bool (default false),
 *     "metadata": { string: string } (at most 16 pairs, 512 bytes each),
 *     "webhook_url": string (http:// or https://, at most 2048 bytes: ephemerald POSTs the
 *                    run's end there, signed with the organisation's default secret; the
 *                    address policy is judged by the daemon, not here) }
 *
 * Parsing is strict: an unknown field, a wrong type or a value out of range is an error that
 * names the field; a value above an operator maximum is refused, never clamped. */
#ifndef EPH_REQUEST_H
#define EPH_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

#define EPH_PROMPT_MAX_BYTES (1024 * 1024)
#define EPH_FILES_MAX_COUNT 256
#define EPH_OUTPUTS_MAX_COUNT 32
#define EPH_METADATA_MAX_PAIRS 16
#define EPH_METADATA_MAX_BYTES 512

typedef struct eph_connection_grant {
  char *name;
  char **methods; /* NULL = every method the operator allows; else upper-case names */
  size_t n_methods;
} eph_connection_grant_t;

typedef struct eph_inline_file {
  char *path;          /* relative to scratch, checked: no "..", not absolute */
  unsigned char *data; /* decoded bytes */
  size_t bytes;
} eph_inline_file_t;

typedef struct eph_request {
  char *prompt;
  char *model;
  bool shell, web;
  bool files_granted; /* "files" present: the file tools are offered */
  eph_inline_file_t *files;
  size_t n_files;
  size_t files_total_bytes;
  eph_connection_grant_t *connections;
  size_t n_connections;
  char **outputs;
  size_t n_outputs;
  int64_t timeout_seconds;
  int64_t max_cost_micros;
  bool zero_data_retention;
  json_object *metadata; /* object of strings, or NULL; owned */
  char *webhook_url;     /* or NULL; owned */
} eph_request_t;

struct eph_plugins;

/* Operator limits the request is checked against. */
typedef struct eph_request_limits {
  int64_t max_timeout_seconds;
  int64_t max_cost_micros;
  size_t max_files_total_bytes;
  const char *default_model;
  /* The loaded plugins (borrowed): every granted connection must be one a tool plugin
   * says the operator defined (eph_tool_ops_t.connection_defined), else the field
   * "connections[i].name" is invalid. NULL: not checked (unit tests of the shape only). */
  const struct eph_plugins *plugins;
} eph_request_limits_t;

/* Parses and validates `json` (len bytes). On success fills *req (release with
 * eph_request_free). On failure returns negative: -EINVAL (invalid field) or -EBADMSG
 * (malformed JSON), err->message names the field, and *field (if non-NULL) receives the
 * field's path ("timeout_seconds", "files[2].content") as a static or thread-local string
 * valid until the next call on this thread. */
int eph_request_parse(const char *json, size_t len, const eph_request_limits_t *limits,
                      eph_request_t *req, const char **field, eph_error_t *err);
void eph_request_free(eph_request_t *req);

/* The request as stored and returned in the run object: everything but inline file
 * contents; under zero data retention without the prompt. New reference, owned by the
 * caller. */
json_object *eph_request_to_json(const eph_request_t *req);

/* The permission table as tools see it (eph_tool_call_t.grants). Owned by the caller. */
json_object *eph_request_grants(const eph_request_t *req);

#endif
