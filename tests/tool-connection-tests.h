/* What the two halves of the tool-connection tests share (tests/test-tool-connection.c,
 * tests/test-tool-connection-hostile.c: one program): the secret, the calls through the
 * broker, and the hostile upstream the second half runs against. */
#ifndef EPH_TESTS_TOOL_CONNECTION_H
#define EPH_TESTS_TOOL_CONNECTION_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <microhttpd.h>
#include <openssl/crypto.h>

#include "tools-harness.h"
#include "util.h"

#define SECRET "s3cr3t-T0ken/with+chars=="
#define BASIC_USER "robot"
#define BASIC_PW "pa55-w0rd-xyz"

/* One call of the broker's tool `connection` with args and grants (JSON text); the result
 * (owned by the caller). */
json_object *request(const eph_plugin_slot_t *s, const char *args, const char *grants);

/* tests/test-tool-connection-hostile.c: the hostile upstream (started once by main) and the
 * tests against it. */
extern struct MHD_Daemon *hostile;
void hostile_start(void);
void test_hostile_encodings(void **state);
void test_hostile_header_names(void **state);
void test_hostile_split(void **state);
void test_hostile_utf16(void **state);
void test_hostile_truncation(void **state);

#endif
