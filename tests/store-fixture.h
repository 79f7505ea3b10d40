/* What the store's tests share (tests/test-store.c, tests/test-store-cluster.c): the
 * fixture (a store on a fresh SQLite file, or on EPH_TEST_DATABASE emptied), access to its
 * database behind its back, and the searches that prove what is (not) stored. Definitions
 * in tests/store-fixture.c. */
#ifndef EPH_TESTS_STORE_FIXTURE_H
#define EPH_TESTS_STORE_FIXTURE_H

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>
#ifdef HAVE_LIBPQ
#include <libpq-fe.h>
#endif

#include "admin.h"
#include "store.h"
#include "util.h"

typedef struct fixture {
  char dir[64];
  char path[1024]; /* the SQLite file, or the PostgreSQL URI */
  bool pg;
  eph_store_t *store;
} fixture_t;

#ifdef HAVE_LIBPQ
/* Runs sql on the test database through a connection of its own (a writer that bypasses
 * the store); params: up to 2 text values. Returns the result (caller clears) or fails. */
PGresult *pg_query(fixture_t *f, const char *sql, const char *p1, const char *p2,
                   bool must_succeed);
#endif
/* Runs sql (no parameters) on the store's database behind its back: 0 or -1. */
int sql_exec(fixture_t *f, const char *sql);
int setup(void **st);
int teardown(void **st);
/* Whether needle occurs in the bytes of the database file or its WAL; whether it is stored
 * anywhere in the store (the file's bytes on SQLite, every row of every table as text on
 * PostgreSQL). */
bool file_contains(fixture_t *f, const char *needle);
bool stored_contains(fixture_t *f, const char *needle);
/* The stored SHA-256 of key id, as hex. */
void stored_key_hash(fixture_t *f, const char *id, char out[65]);
/* SHA-256 of body, as hex (the idempotency body hash). */
void sha(const char *body, char out[65]);
/* A stored request object with this prompt. New reference. */
json_object *request(const char *prompt);

/* tests/test-store-cluster.c */
void test_cancel_requests(void **st);
void test_leases(void **st);
void test_queue(void **st);
void test_hostile_values(void **st);
void test_admin_keys_audit_usage(void **st);
void test_target_kind_and_password_hidden(void **st);

#endif
