/* The core's configuration keys (ephemeral.conf): ONE row per key, holding its name, type,
 * default, range, unit and documentation. From these rows come the parsed values
 * (eph_core_conf_t, filled once by eph_config_load), the key check (unknown keys, types,
 * ranges, all with file:line), `ephemeral config keys` and ephemeral.conf(5); a default or a
 * range is written nowhere else (tests/test-conf-doc.c checks the shipped ephemeral.conf's
 * values against the rows).
 *
 * Row kinds (each list below is expanded with the kinds as macro arguments):
 *   I(name, default, min, max, unit, doc)   integer, default and inclusive range in unit
 *   IX(name, default_text, min, max, unit, doc)  integer whose default is derived, or that
 *                                           is required (the group's finish function sets
 *                                           it or refuses its absence; see the doc)
 *   S(name, default, doc)                   string with a literal default
 *   SX(name, default_text, doc)             string whose default is resolved by code (NULL)
 *   B(name, default, doc)                   boolean
 *   L(name, default_text, doc)              list, checked for type only; read by its user
 *   LG(name, type, sub, default_text, doc)  list of groups with the keys sub_keys, parsed
 *                                           into an array `type *name; size_t n_name;`
 *   G(name, type, sub, doc)                 nested group with the keys sub_keys, parsed
 *                                           into the member `type name;`
 * Adding a key is adding its row here: the field, the check, the docs and the page follow.
 * A nested group is one G row plus its own list (and `sub` tables in conf.c). */
#ifndef EPH_CONF_CORE_H
#define EPH_CONF_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EPH_CONF_NOMAX INT64_MAX /* no upper bound */
#define EPH_CONF_STR_(x) #x
#define EPH_CONF_STR(x) EPH_CONF_STR_(x)
/* Without pricing.models every model costs this (the product page's model's prices). */
#define EPH_PRICE_DEFAULT_INPUT_MTOK 50000
#define EPH_PRICE_DEFAULT_OUTPUT_MTOK 280000

/* The rows are a table: aligned by hand, not by clang-format (it splits a row's strings). */
/* clang-format off */
/* ---- ephemeral.conf, top level */
#define EPH_CORE_KEYS(I, IX, S, SX, B, L, LG, G)                                                   \
  SX(plugin_dir, "(build tree or <libdir>/ephemeral/plugins)",                                     \
     "Directory the plugins' .so files are loaded from.")                                          \
  SX(state_dir, "(see ephemeral(1))",                                                              \
     "Directory of the SQLite files (ledger, run history). Overridden by --state-dir and "         \
     "EPHEMERAL_STATE_DIR.")                                                                       \
  SX(database, "(unset: <state_dir>/ephemeral.sqlite)",                                            \
     "Shared PostgreSQL database for runs, keys, leases and (unless `ledger` names another) "    \
     "the money, in ledger-postgres (\"postgresql://...\" URI or libpq key=value string; "        \
     "docs/cluster.md). Overridden by --database and EPHEMERAL_DATABASE.")                        \
  SX(node_name, "(the hostname)",                                                                  \
     "Name of this daemon in a cluster (runs it executes carry it); unique per daemon. "          \
     "EPHEMERAL_NODE_NAME overrides it.")                                                        \
  I(lease_seconds, 15, 2, 3600, "seconds",                                                         \
    "A cluster node's lease on its runs: a run whose node stops renewing it for this long is "     \
    "ended host_lost and settled by another node.")                                                \
  I(cluster_poll_ms, 1500, 100, 3600000, "ms",                                                     \
    "A cluster node's safety poll: while its LISTEN connection is up it looks at the database "    \
    "this often for queued runs, cancel requests and followed runs' events that a lost "           \
    "notification would miss (while it is down: every 200-250 ms).")                               \
  SX(ledger, "(unset: ledger-postgres with a PostgreSQL database, else the first enabled ledger)",  \
     "The ledger plugin (the money). Unset: with a PostgreSQL `database` the ledger is "            \
     "ledger-postgres in that database (every node shares it); otherwise the first enabled "      \
     "ledger-* block. Naming one loads that block whatever its `enabled` says and no other "      \
     "ledger-* block (docs/cluster.md).")                                                          \
  S(log_level, "warn", "Least severe level logged to stderr: error, warn, info or debug.")         \
  S(backend, "backend-jail", "Backend plugin used when a request or command does not name one.")   \
  S(model_plugin, "model-openai",                                                                  \
    "Model plugin serving model calls; model names starting with \"replay:\" always go to "        \
    "model-replay (ephemerald refuses them from requests unless this is \"model-replay\"). "       \
    "\"model-replay\" makes every run replay model-replay's configured "                           \
    "transcript (an offline daemon: demos, tests).")                                               \
  S(default_model, "openai/gpt-6-luna",                                                            \
    "Model used when the request does not name one (the product page's model).")                   \
  I(max_timeout_seconds, 900, 1, 2147483, "seconds",                                               \
    "Largest timeout_seconds a request may ask for; larger requests are refused.")                 \
  I(max_cost_micros, 10000000, 1, 1000000000000, "micros",                                         \
    "Largest max_cost_micros (budget) a request may ask for; larger requests are refused.")        \
  I(max_steps, 24, 1, 100000, NULL,                                                                \
    "Most model calls one run may make before it ends with reason step_limit.")                    \
  I(max_output_tokens, 4096, 1, 10000000, "tokens",                                                \
    "Output tokens each model call may produce; the call is pre-authorised at this worst "         \
    "case.")                                                                                       \
  I(compute_meter_ms, 2000, 10, 3600000, "ms",                                                     \
    "How often sandbox compute is charged while a run lives (a crash loses at most one "           \
    "interval).")                                                                                  \
  I(event_flush_ms, 50, 0, 10000, "ms",                                                          \
    "Longest a timeline event waits before it is committed to an SQLite store: a run's "         \
    "events are written in one transaction per batch (a kill -9 loses at most this "              \
    "interval of events; the run's end and every write of its record are committed at "          \
    "once). 0: one transaction per event. PostgreSQL stores each event as it comes.")              \
  I(retention_days, 30, 0, 36500, "days",                                                          \
    "Runs and their events older than this are purged (the product page keeps 30 days).")          \
  S(cli_org, "local", "Organisation the CLI's runs are billed to.")                                \
  I(cli_credit_micros, 10000000, 0, 1000000000000, "micros",                                       \
    "Credit given to cli_org the first time the CLI uses a new state directory.")                  \
  G(pricing, eph_pricing_conf_t, pricing,                                                          \
    "Prices in micros: compute_micros_per_second (sandbox time) and a list `models` of "           \
    "{name, input_micros_per_mtok, output_micros_per_mtok, cached_input_micros_per_mtok, "         \
    "cache_write_micros_per_mtok}, each described below as pricing.KEY and "                       \
    "pricing.models.KEY. A sandbox's web connections are priced in egress "                        \
    "(price_micros_per_request); sandbox limits in the backend's block.")                          \
  I(max_inline_files_bytes, 16777216, 0, 1073741824, "bytes",                                      \
    "Largest total size of a request's inline files (after base64 decoding).")                     \
  I(max_stored_results_bytes, 4194304, 0, 1073741824, "bytes",                                    \
    "Most bytes of tool results one run's timeline keeps (its tool_result events' data, as "      \
    "JSON): past it a result is kept as its size and a marker; the model still gets it whole. "    \
    "Results are what a sandbox wrote (a file_read is up to 1 MiB, a turn may make many calls).") \
  I(max_output_files_bytes, 4194304, 0, 1073741824, "bytes",                                      \
    "Most bytes of the files a run saves for request.outputs, all files together (each at "        \
    "most 1 MiB), kept base64 in the run's record for retention_days: a file past it is cut "      \
    "(truncated) or not read (error). 0: no file is saved.")                                       \
  G(egress, eph_egress_conf_t, egress,                                                             \
    "The sandbox egress proxy of runs granting web: pool, port, max_connections, max_bytes, "      \
    "max_connection_ms, idle_ms, what a connection costs (price_micros_per_request) and where "    \
    "sandboxes may go (allow_domains, deny_domains, allowed_ports, allow_private_addresses, "       \
    "allow_loopback), each described below as egress.KEY.")                                        \
  G(webhooks, eph_webhooks_conf_t, webhooks,                                                       \
    "Where and how run-end webhooks are delivered (POST /v1/webhooks registers one): "             \
    "retry_hours, retry_base_ms, timeout_ms and the address policy, read like tool-web's: "        \
    "allow_domains, deny_domains, allowed_ports, allow_private_addresses and allow_loopback; "     \
    "each described below as webhooks.KEY.")                                                       \
  G(server, eph_server_conf_t, server,                                                             \
    "ephemerald's settings: listen, max_concurrent_runs, max_queued_runs, max_body_bytes, "        \
    "drain_grace_seconds, idempotency_hours, max_inflight_body_bytes, max_connections, "           \
    "max_connections_per_ip, header_timeout_seconds, body_timeout_seconds and "                    \
    "idle_timeout_seconds, each described below as server.KEY.")

/* ---- pricing: { ... } */
#define EPH_PRICING_KEYS(I, IX, S, SX, B, L, LG, G)                                                \
  I(compute_micros_per_second, 240, 0, 1000000000, "micros",                                       \
    "Price of one second of sandbox time.")                                                        \
  LG(models, eph_price_model_t, price_model,                                                      \
     "(absent: every model at " EPH_CONF_STR(EPH_PRICE_DEFAULT_INPUT_MTOK) " input, "              \
     EPH_CONF_STR(EPH_PRICE_DEFAULT_OUTPUT_MTOK) " output micros per million tokens)",           \
     "Prices of the models, one group each (keys below as pricing.models.KEY). When the list "     \
     "is given, a request for a model it does not name is refused.")

/* ---- pricing: { models = ( { ... } ) } */
#define EPH_PRICE_MODEL_KEYS(I, IX, S, SX, B, L, LG, G)                                            \
  SX(name, "(required)",                                                                           \
     "The full model name with its provider prefix, e.g. "                                         \
     "\"openai/gpt-6-luna\".")                                                                     \
  IX(input_micros_per_mtok, "(required)", 0, 100000000000, "micros",                               \
     "Price of a million prompt tokens (0 for a model that costs nothing).")                       \
  IX(output_micros_per_mtok, "(required)", 0, 100000000000, "micros",                              \
     "Price of a million output tokens.")                                                          \
  IX(cached_input_micros_per_mtok, "(the input price)", 0, 100000000000, "micros",                 \
     "Price of a million prompt tokens read from the provider's cache.")                           \
  IX(cache_write_micros_per_mtok, "(the input price)", 0, 100000000000, "micros",                  \
     "Price of a million prompt tokens written to the provider's cache (Anthropic).")

/* ---- egress: { ... } */
#define EPH_EGRESS_KEYS(I, IX, S, SX, B, L, LG, G)                                                 \
  S(pool, "10.213.0.0/16", "Private IPv4 range the per-sandbox /30s come from.")                   \
  I(port, 3128, 1, 65535, NULL, "Port of the proxy inside each sandbox's network.")                \
  I(max_connections, 32, 1, 4096, NULL, "Connections open at once per run.")                       \
  I(max_bytes, 67108864, 1, EPH_CONF_NOMAX, "bytes", "Bytes one connection may carry.")            \
  I(max_connection_ms, 300000, 1, EPH_CONF_NOMAX, "ms", "How long one connection may last.")       \
  I(idle_ms, 30000, 1, EPH_CONF_NOMAX, "ms", "A connection without traffic this long closes.")     \
  I(price_micros_per_request, 1000, 0, 1000000000, "micros",                                       \
    "What one connection costs (category web).")                                                   \
  L(allow_domains, "[] (any)",                                                                     \
    "Domains sandboxes may reach (a leading \".\" takes subdomains); empty: any not denied. "       \
    "The one place saying where sandboxes may go: a web tool's own keys govern only the "          \
    "requests it makes on the host.")                                                              \
  L(deny_domains, "[]", "Domains sandboxes may never reach.")                                      \
  L(allowed_ports, "[80, 443]", "Ports sandboxes may connect to.")                                 \
  B(allow_private_addresses, false, "Allow destinations on private networks.")                     \
  B(allow_loopback, false,                                                                         \
    "Allow loopback destinations (addresses of the host's interfaces are always refused).")

/* ---- webhooks: { ... } */
#define EPH_WEBHOOKS_KEYS(I, IX, S, SX, B, L, LG, G)                                               \
  I(retry_hours, 24, 1, 720, "hours",                                                              \
    "How long a failing endpoint is retried after the run ended.")                                 \
  I(retry_base_ms, 10000, 100, 3600000, "ms",                                                      \
    "The first retry's delay, doubling per attempt up to an hour.")                                \
  I(timeout_ms, 10000, 100, 120000, "ms", "Time one delivery attempt may take.")                   \
  L(allow_domains, "[] (any)",                                                                     \
    "Domains endpoints may be on (a leading \".\" takes "                                          \
    "subdomains); empty: any not denied.")                                                         \
  L(deny_domains, "[]", "Domains endpoints may never be on.")                                      \
  L(allowed_ports, "[80, 443]", "Ports endpoints may use.")                                        \
  B(allow_private_addresses, false,                                                                \
    "Allow endpoints on private networks (a tenant's endpoint on the operator's network is "       \
    "refused otherwise, at registration and at every attempt).")                                   \
  B(allow_loopback, false,                                                                         \
    "Allow endpoints on loopback addresses (addresses of the host's "                              \
    "interfaces are always refused).")

/* ---- server: { ... } (ephemerald) */
#define EPH_SERVER_KEYS(I, IX, S, SX, B, L, LG, G)                                                 \
  S(listen, "127.0.0.1:8080",                                                                      \
    "Address to listen on: \"ADDR:PORT\" or \"[V6ADDR]:PORT\"; port 0 picks a free port; "         \
    "ephemerald --listen overrides.")                                                              \
  I(max_concurrent_runs, 4, 1, 1024, NULL, "Runs executing at once (run workers).")                \
  I(max_queued_runs, 64, 0, 100000, NULL,                                                          \
    "Runs admitted beyond those executing; POST /v1/runs answers 429 beyond.")                     \
  I(max_body_bytes, 25165824, 1024, 1073741824, "bytes", "Request body limit; larger is 413.")     \
  I(drain_grace_seconds, 30, 0, 86400, "seconds",                                                  \
    "On SIGTERM, how long running runs may go on before they are cancelled.")                      \
  I(idempotency_hours, 24, 24, 8760, "hours",                                                      \
    "How long an Idempotency-Key is remembered per organisation.")                                 \
  I(max_inflight_body_bytes, 100663296, 1024, 1099511627776, "bytes",                              \
    "Request bodies being received at once, all clients together (a declared "                     \
    "Content-Length counts in full); beyond, 503 with Retry-After. At least max_body_bytes.")      \
  I(max_connections, 4096, 16, 1000000, NULL,                                                      \
    "HTTP connections open at once (lowered to fit the open-file limit); more are closed.")        \
  I(max_connections_per_ip, 64, 1, 1000000, NULL,                                                  \
    "HTTP connections open at once from one client address; more are closed at once.")             \
  I(header_timeout_seconds, 10, 1, 3600, "seconds",                                                \
    "A connection must send a complete request head within this (from connecting, or from "        \
    "its previous answer); else it is closed.")                                                    \
  I(body_timeout_seconds, 60, 1, 86400, "seconds",                                                 \
    "A request body must be complete within this after its head; else the connection is "          \
    "closed.")                                                                                     \
  I(idle_timeout_seconds, 60, 1, 86400, "seconds",                                                 \
    "A connection without any traffic for this long is closed (SSE streams send a "                \
    "keep-alive every 15 s).")

/* clang-format on */

/* ---- the structs the rows fill: one member per row. Strings are borrowed from the config
 * tree (valid until eph_config_free) or are the static default; NULL for an SX row not set. */
#define EPH_CONF_F_I(n, ...) int64_t n;
#define EPH_CONF_F_S(n, ...) const char *n;
#define EPH_CONF_F_B(n, ...) bool n;
#define EPH_CONF_F_L(n, ...)
#define EPH_CONF_F_LG(n, type, ...)                                                                \
  type *n;                                                                                         \
  size_t n_##n;
#define EPH_CONF_F_G(n, type, ...) type n;
#define EPH_CONF_FIELDS(LIST)                                                                      \
  LIST(EPH_CONF_F_I, EPH_CONF_F_I, EPH_CONF_F_S, EPH_CONF_F_S, EPH_CONF_F_B, EPH_CONF_F_L,         \
       EPH_CONF_F_LG, EPH_CONF_F_G)

typedef struct eph_price_model {
  EPH_CONF_FIELDS(EPH_PRICE_MODEL_KEYS)
} eph_price_model_t;
typedef struct eph_pricing_conf {
  EPH_CONF_FIELDS(EPH_PRICING_KEYS)
} eph_pricing_conf_t;
typedef struct eph_egress_conf {
  EPH_CONF_FIELDS(EPH_EGRESS_KEYS)
} eph_egress_conf_t;
typedef struct eph_webhooks_conf {
  EPH_CONF_FIELDS(EPH_WEBHOOKS_KEYS)
} eph_webhooks_conf_t;
typedef struct eph_server_conf {
  EPH_CONF_FIELDS(EPH_SERVER_KEYS)
} eph_server_conf_t;
/* Every value of ephemeral.conf, defaults applied, ranges checked. */
typedef struct eph_core_conf {
  EPH_CONF_FIELDS(EPH_CORE_KEYS)
} eph_core_conf_t;

#endif
