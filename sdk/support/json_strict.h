/* The one strict parser of a whole JSON text: what the project takes as exactly one JSON
 * value and nothing else (a request file or body, a guest protocol frame), shared by the
 * core (eph_json_parse_strict, core/util.c) and the guest protocol's frame reader
 * (eph_proto_parse_body, guest/protocol.h: the static guest compiles this file itself, as
 * it does base64.c). */
#ifndef EPH_SUPPORT_JSON_STRICT_H
#define EPH_SUPPORT_JSON_STRICT_H

#include <stdbool.h>
#include <stddef.h>

#include <json-c/json.h>

/* Also refuse text that is not valid UTF-8 (json-c's JSON_TOKENER_VALIDATE_UTF8). */
#define EPH_JSON_STRICT_UTF8 1u

/* Where and why a text was refused. */
typedef struct eph_json_fault {
  size_t offset;    /* byte offset in the text of the fault (<= len) */
  bool trailing;    /* a whole value ended before offset; what follows it is not a blank */
  bool truncated;   /* the text ended inside the value (json-c's "continue") */
  const char *desc; /* static: json-c's description, "unexpected end of input" when
                       truncated, "trailing data" when trailing */
} eph_json_fault_t;

/* Parses text[0..len) as exactly one JSON value followed only by blanks (space, tab, CR,
 * LF; a NUL is not a blank, nor is a comment), strictly: json-c's JSON_TOKENER_STRICT
 * refuses comments, single-quoted values and trailing commas, all of which it otherwise
 * takes ("{...}//anything" passed as one object: the frame fuzzer found it). Not RFC 8259
 * to the letter: json-c 0.16 still takes a single-quoted member name, NaN, Infinity, "1."
 * and a raw tab inside a string; the callers' typed fields refuse what matters of those.
 * flags: 0 or EPH_JSON_STRICT_UTF8. Any type of value: a caller wanting an object checks.
 * Returns 0 with *out set (a new reference owned by the caller), -EBADMSG with *fault
 * filled (*out NULL), or -ENOMEM. len above INT32_MAX is refused (-EBADMSG, json-c takes
 * an int length). */
int eph_json_parse_one(const char *text, size_t len, unsigned flags, json_object **out,
                       eph_json_fault_t *fault);

#endif
