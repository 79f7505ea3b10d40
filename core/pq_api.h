/* libpq, bound on first use (sdk/support/lazylib.h): the functions core/store_pg.c calls,
 * so the `ephemeral` CLI and ephemerald do not load libpq and its ~25 libraries (GnuTLS,
 * Kerberos, LDAP, SASL) at start-up, only when a PostgreSQL store is opened.
 *
 * Include this instead of <libpq-fe.h>: the calls keep their names (macros below) and
 * their types (taken from libpq-fe.h). eph_store_pg_open() calls eph_pq_load() before
 * anything else; every other function of store_pg.c runs on a store it opened. */
#ifndef EPH_CORE_PQ_API_H
#define EPH_CORE_PQ_API_H

#include <libpq-fe.h>

#include <ephemeral/plugin.h>

#include "support/lazylib.h"

#define EPH_PQ_FUNCTIONS(X)                                                                        \
  X(PQclear)                                                                                       \
  X(PQcmdTuples)                                                                                   \
  X(PQbackendPID)                                                                                  \
  X(PQconnectdb)                                                                                   \
  X(PQconnectdbParams)                                                                             \
  X(PQconninfo)                                                                                    \
  X(PQconsumeInput)                                                                                \
  X(PQconninfoFree)                                                                                \
  X(PQconninfoParse)                                                                               \
  X(PQerrorMessage)                                                                                \
  X(PQexec)                                                                                        \
  X(PQexecParams)                                                                                  \
  X(PQfinish)                                                                                      \
  X(PQfname)                                                                                       \
  X(PQfreemem)                                                                                     \
  X(PQftype)                                                                                       \
  X(PQgetisnull)                                                                                   \
  X(PQgetlength)                                                                                   \
  X(PQgetvalue)                                                                                    \
  X(PQnfields)                                                                                     \
  X(PQnotifies)                                                                                    \
  X(PQntuples)                                                                                     \
  X(PQreset)                                                                                       \
  X(PQresultErrorField)                                                                            \
  X(PQresultErrorMessage)                                                                          \
  X(PQresultStatus)                                                                                \
  X(PQsetNoticeProcessor)                                                                          \
  X(PQsocket)                                                                                      \
  X(PQstatus)                                                                                      \
  X(PQtransactionStatus)

EPH_LAZYLIB_API(eph_pq_api_t, EPH_PQ_FUNCTIONS);

/* Filled by the first successful eph_pq_load(); read-only afterwards. */
extern eph_pq_api_t eph_pq_api;

/* 0 once libpq (EPH_SONAME_PQ, e.g. libpq.so.5) is loaded and bound; else -ELIBACC, err names why.
 */
int eph_pq_load(eph_error_t *err);

#ifndef EPH_PQ_API_IMPLEMENTATION
#define PQclear (eph_pq_api.PQclear)
#define PQcmdTuples (eph_pq_api.PQcmdTuples)
#define PQbackendPID (eph_pq_api.PQbackendPID)
#define PQconnectdb (eph_pq_api.PQconnectdb)
#define PQconnectdbParams (eph_pq_api.PQconnectdbParams)
#define PQconninfo (eph_pq_api.PQconninfo)
#define PQconsumeInput (eph_pq_api.PQconsumeInput)
#define PQconninfoFree (eph_pq_api.PQconninfoFree)
#define PQconninfoParse (eph_pq_api.PQconninfoParse)
#define PQerrorMessage (eph_pq_api.PQerrorMessage)
#define PQexec (eph_pq_api.PQexec)
#define PQexecParams (eph_pq_api.PQexecParams)
#define PQfinish (eph_pq_api.PQfinish)
#define PQfname (eph_pq_api.PQfname)
#define PQfreemem (eph_pq_api.PQfreemem)
#define PQftype (eph_pq_api.PQftype)
#define PQgetisnull (eph_pq_api.PQgetisnull)
#define PQgetlength (eph_pq_api.PQgetlength)
#define PQgetvalue (eph_pq_api.PQgetvalue)
#define PQnfields (eph_pq_api.PQnfields)
#define PQnotifies (eph_pq_api.PQnotifies)
#define PQntuples (eph_pq_api.PQntuples)
#define PQreset (eph_pq_api.PQreset)
#define PQresultErrorField (eph_pq_api.PQresultErrorField)
#define PQresultErrorMessage (eph_pq_api.PQresultErrorMessage)
#define PQresultStatus (eph_pq_api.PQresultStatus)
#define PQsetNoticeProcessor (eph_pq_api.PQsetNoticeProcessor)
#define PQsocket (eph_pq_api.PQsocket)
#define PQstatus (eph_pq_api.PQstatus)
#define PQtransactionStatus (eph_pq_api.PQtransactionStatus)
#endif

#endif
