/* The one strict parser of a whole JSON text (json_strict.h). */
#include "json_strict.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

int
eph_json_parse_one(const char *text, size_t len, unsigned flags, json_object **out,
                   eph_json_fault_t *fault)
{
  *out = NULL;
  *fault = (eph_json_fault_t){.offset = 0, .desc = "too long"};
  if (len > INT32_MAX)
    return -EBADMSG;
  if (!text)
    text = "", len = 0;
  json_tokener *tok = json_tokener_new();
  if (!tok)
    return -ENOMEM;
  /* Trailing characters allowed by json-c so that they are refused below as what they are
   * (trailing data, at their offset), whatever they are. */
  int jflags = JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS;
  if (flags & EPH_JSON_STRICT_UTF8)
    jflags |= JSON_TOKENER_VALIDATE_UTF8;
  json_tokener_set_flags(tok, jflags);
  json_object *v = json_tokener_parse_ex(tok, text, (int)len);
  enum json_tokener_error jerr = json_tokener_get_error(tok);
  size_t used = json_tokener_get_parse_end(tok);
  json_tokener_free(tok);
  if (used > len)
    used = len;
  if (!v || jerr != json_tokener_success) {
    json_object_put(v);
    fault->offset = used;
    /* json-c reports text that ends inside a value as "continue" (it waits for more). */
    fault->truncated = jerr == json_tokener_continue;
    fault->desc = fault->truncated ? "unexpected end of input" : json_tokener_error_desc(jerr);
    return -EBADMSG;
  }
  /* Blanks only: memchr, as strchr() would also find the string's own NUL terminator and
   * so let NUL bytes after the value through (json-c stops at a NUL). */
  while (used < len && memchr(" \t\r\n", text[used], 4))
    used++;
  if (used != len) {
    json_object_put(v);
    fault->offset = used;
    fault->trailing = true;
    fault->desc = "trailing data";
    return -EBADMSG;
  }
  *out = v;
  return 0;
}
