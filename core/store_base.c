/* What both store implementations share of the base struct: its set-up and release, and
 * the fault state /v1/health reports. A unit below store.c and the implementations, so the
 * dispatch (store.c -> store_sqlite.c, store_pg.c) never makes a cycle with it. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "store_int.h"
#include "util.h"

void
eph_store_base_init(eph_store_t *s, const eph_store_ops_t *ops, const char *path,
                    int64_t idempotency_us)
{
  s->ops = ops;
  s->path = eph_xstrdup(path);
  s->idempotency_us = idempotency_us;
  pthread_mutex_init(&s->fault_lock, NULL);
}

void
eph_store_base_free(eph_store_t *s)
{
  pthread_mutex_destroy(&s->fault_lock);
  free(s->path);
}

void
eph_store_fault_set(eph_store_t *s, bool damaged, const char *message)
{
  pthread_mutex_lock(&s->fault_lock);
  bool was_ok = !s->fault[0] && !s->damaged[0];
  if (damaged)
    snprintf(s->damaged, sizeof s->damaged, "%s", message);
  else
    snprintf(s->fault, sizeof s->fault, "%s", message);
  pthread_mutex_unlock(&s->fault_lock);
  if (was_ok)
    eph_error("%s (the store is failing; see /v1/health or `ephemeral doctor`)", message);
}

void
eph_store_fault_clear(eph_store_t *s)
{
  pthread_mutex_lock(&s->fault_lock);
  bool was_failing = s->fault[0] != '\0';
  s->fault[0] = '\0';
  pthread_mutex_unlock(&s->fault_lock);
  if (was_failing)
    eph_info("%s: writes succeed again", s->path);
}
