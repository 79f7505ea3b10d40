#!/bin/bash
# bench/cluster-bench.sh: issue 15's figures (docs/cluster.md), on a throw-away PostgreSQL
# cluster of tests/with-pg (a Unix socket, fsync and synchronous_commit on):
#
#   1. POST /v1/runs admissions per second: an ephemerald on SQLite (store + ledger-sqlite,
#      the shipped default)  vs  one on PostgreSQL (store + ledger-postgres, the cluster
#      setup), in interleaved rounds (S, P, P, S, ...); each round posts ADMIT_N runs of
#      the product page's example over 4 keep-alive connections (curl --parallel) and
#      times them until the last 201. Only admission is measured: each daemon has one run
#      worker, kept busy by a run sleeping in its sandbox, so every admitted run waits in
#      the queue and nothing executes meanwhile.
#   2. runs per second with 1, 2 and 3 ephemerald nodes sharing one PostgreSQL database
#      (each node with WORKERS run workers, its own state directory and port): RUNS runs of
#      the product page's example (jail sandbox, replayed model, offline) posted round-robin
#      over the nodes, timed from the first POST until the last one's `settled` event is in
#      the database. The node counts are interleaved (1, 2, 3, then 3, 2, 1, ...). Every
#      node runs on the same machine, so the figure is CPU-bound: it is reported as a ratio
#      to one node.
#
# Usage: tests/with-pg bench/cluster-bench.sh [ROWS]   as root, from the build tree
#   (bench/run-bench.sh runs it). ROWS: a file to append the Markdown table rows to
#   ("| figure | ephemeral | peer | peer figure | ratio |"); they are printed too.
# Knobs: BENCH_CLUSTER_ROUNDS (default 5 admission rounds, node rounds = (it + 1) / 2),
#   BENCH_ADMIT_N (runs posted per admission round, 60), BENCH_CLUSTER_RUNS (runs per
#   node-count measurement, 16), BENCH_CLUSTER_WORKERS (server.max_concurrent_runs of each
#   node, 2). BENCH_ADMIT_PROFILE=FILE: after the admission rounds, every statement the
#   server runs for 10 more admissions (log_statement, log_duration) is copied to FILE: the
#   round trips and commits behind the figure (docs/cluster.md, "Performance").
#   BENCH_ADMIT_OTHER=PATH: a third daemon, PATH (the ephemerald of another build, e.g.
#   the code before a change), on PostgreSQL in the same interleaved admission rounds:
#   before and after side by side.
#   Figures only: nothing here passes or fails on speed.
set -u
[ -n "${EPH_TEST_DATABASE:-}" ] || { echo "cluster-bench: run it under tests/with-pg"; exit 1; }
top=$(cd "$(dirname "$0")/.." && pwd)
EPH_BUILDDIR=${EPH_BUILDDIR:-$(pwd)}
EPH_SRCDIR=${EPH_SRCDIR:-$top}
ROWS=${1:-/dev/null}
ROUNDS=${BENCH_CLUSTER_ROUNDS:-5}
ADMIT_N=${BENCH_ADMIT_N:-60}
RUNS=${BENCH_CLUSTER_RUNS:-16}
WORKERS=${BENCH_CLUSTER_WORKERS:-2}
. "$EPH_SRCDIR/tests/tap.sh" >/dev/null
. "$EPH_SRCDIR/tests/daemon-lib.sh"
[ "$(id -u)" = 0 ] || { echo "cluster-bench: needs root (sandboxes)"; exit 1; }
if ! ls "$EPH_BUILDDIR"/plugins/.libs/ledger-postgres.so >/dev/null 2>&1; then
  echo "cluster-bench: plugins/ledger-postgres is not built (libpq-dev): nothing to compare"
  exit 0
fi
tmp=$(mktemp -d /tmp/eph-cluster-bench.XXXXXX)
declare -A PIDS URLS
stop_node() { [ -n "${PIDS[$1]:-}" ] && kill -TERM "${PIDS[$1]}" 2>/dev/null && wait "${PIDS[$1]}" 2>/dev/null; PIDS[$1]=; }
stop_all() { for n in "${!PIDS[@]}"; do stop_node "$n"; done; }
trap 'stop_all; [ -n "${PQ_PID:-}" ] && kill "$PQ_PID" 2>/dev/null; rm -rf "$tmp"' EXIT
ex=$EPH_SRCDIR/examples/sandbox-proof
pgconf=$(ls "$EPH_CONFD"/*ledger-postgres*.conf | head -n1)

stats() {
  python3 -c 'import sys, statistics as s
v = [float(x) for x in open(sys.argv[1]) if x.strip()]
print("%.1f (%.1f-%.1f)" % (s.median(v), min(v), max(v)) if v else "n/a")' "$1"
}
med() { python3 -c 'import sys, statistics as s; v=[float(x) for x in open(sys.argv[1]) if x.strip()]; print(s.median(v) if v else 0)' "$1"; }
ratio() { python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print("%.2fx" % (a / b) if b else "n/a")' "$1" "$2"; }
row() { echo "| $1 | $2 | $3 | $4 | $5 |" >>"$ROWS"; echo "  $1: $2 | $3: $4 | $5"; }

# newdb NAME: a database of its own in the throw-away cluster; prints its URI.
newdb() {
  "$EPH_TEST_PG_BINDIR/createdb" "$1" || return 1
  echo "${EPH_TEST_DATABASE/ephemeral_test/$1}"
}
# config DIR DB SERVER: a daemon configuration; with DB, the PostgreSQL store and
# ledger-postgres on it (as tests/cluster.test configures a node), else SQLite.
config() {
  local dir=$1 db=$2 server=$3 name
  name=$(basename "$dir")
  if [ -n "$db" ]; then
    daemon_config "$dir" "database = \"$db\"; node_name = \"$name\";
$server"
  else
    daemon_config "$dir" "$server"
  fi
  rm "$dir/cfg/conf.d"
  mkdir "$dir/cfg/conf.d"
  cp "$EPH_CONFD"/*.conf "$dir/cfg/conf.d/"
  if [ -n "$db" ]; then
    local db_sed=${db//&/\\&}
    sed -i 's/^  enabled = true;/  enabled = false;/' "$dir/cfg/conf.d/"*ledger-sqlite*.conf
    sed -i -e 's/^  enabled = false;/  enabled = true;/' \
      -e "s|^  # database = .*|  database = \"$db_sed\";|" \
      -e "s|^  # node_name = .*|  node_name = \"$name\";|" "$dir/cfg/conf.d/$(basename "$pgconf")"
  fi
}
start() { # start NAME [EPHEMERALD]: the daemon of $tmp/NAME
  CFG=$tmp/$1/cfg/ephemeral.conf STATE=$tmp/$1/state DLOG=$tmp/$1/daemon.log
  local this=$EPHEMERALD
  EPHEMERALD=${2:-$this}
  daemon_start || { EPHEMERALD=$this; return 1; }
  EPHEMERALD=$this
  PIDS[$1]=$DPID URLS[$1]=$URL
  DPID=
}
# posts URL_LIST N FILE KEY [QUERY]: N POSTs of the example over 4 connections, round-robin
# over the URLs; the HTTP codes into FILE.
posts() {
  local -a urls
  read -r -a urls <<<"$1"
  local n=$2 i
  for i in $(seq "$n"); do
    [ "$i" -gt 1 ] && echo next
    printf 'url = "%s/v1/runs%s"\nrequest = "POST"\nheader = "Authorization: Bearer %s"\n' \
      "${urls[$((i % ${#urls[@]}))]}" "${5:-}" "$4"
    printf 'header = "Content-Type: application/json"\ndata = "@%s"\noutput = "/dev/null"\n' "$ex/request.json"
    printf 'write-out = "%%{http_code}\\n"\n'
  done >"$tmp/post.cfg"
  curl -sS -Z --parallel-max 4 -K "$tmp/post.cfg" >"$3" 2>/dev/null
}
ns() { date +%s%N; }

# ---- 1. admissions per second, SQLite vs PostgreSQL
echo "== cluster 1. POST /v1/runs admissions/s, SQLite vs PostgreSQL ($ROUNDS interleaved rounds of $ADMIT_N)"
ADB=$(newdb eph_bench_admit) || exit 1
srv="server: { max_concurrent_runs = 1; max_queued_runs = 100000; drain_grace_seconds = 0; };"
config "$tmp/sqlite" "" "$srv"
config "$tmp/pg" "$ADB" "$srv"
CFG=$tmp/sqlite/cfg/ephemeral.conf STATE=$tmp/sqlite/state
KEYS[0]=$(new_key bench bench)
eph orgs credit bench 1000000000000 >/dev/null
CFG=$tmp/pg/cfg/ephemeral.conf STATE=$tmp/pg/state
KEYS[1]=$(eph --database "$ADB" keys create --org bench --name bench 2>/dev/null)
eph --database "$ADB" orgs credit bench 1000000000000 >/dev/null
names=(sqlite pg)
if [ -n "${BENCH_ADMIT_OTHER:-}" ]; then
  ODB=$(newdb eph_bench_admit_other) || exit 1
  config "$tmp/other" "$ODB" "$srv"
  CFG=$tmp/other/cfg/ephemeral.conf STATE=$tmp/other/state
  KEYS[2]=$(eph --database "$ODB" keys create --org bench --name bench 2>/dev/null)
  eph --database "$ODB" orgs credit bench 1000000000000 >/dev/null
  start other "$BENCH_ADMIT_OTHER" || exit 1
  names+=(other)
  : >"$tmp/a.other"
fi
start sqlite && start pg || exit 1
# The one worker of each: a run sleeping in its sandbox for the whole bench.
sed 's/sleep 30; echo woke/sleep 900/' "$EPH_SRCDIR/tests/transcripts/sleep.jsonl" >"$tmp/sleep.jsonl"
block='{"prompt":"block","model":"replay:'$tmp'/sleep.jsonl","shell":true,"timeout_seconds":900,"max_cost_micros":40000}'
for k in "${!names[@]}"; do
  u=${URLS[${names[$k]}]}
  rid=$(curl -sS -X POST "$u/v1/runs" -H "Authorization: Bearer ${KEYS[$k]}" -H "Content-Type: application/json" -d "$block" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  for _ in $(seq 600); do
    curl -sS "$u/v1/runs/$rid" -H "Authorization: Bearer ${KEYS[$k]}" | grep -q '"kind":"tool_call"' && break
    sleep 0.05
  done
  curl -sS "$u/v1/runs/$rid" -H "Authorization: Bearer ${KEYS[$k]}" | grep -q '"kind":"tool_call"' ||
    { echo "cluster-bench: the blocking run did not start on ${names[$k]}"; exit 1; }
done
: >"$tmp/a.sqlite"; : >"$tmp/a.pg"
for r in $(seq "$ROUNDS"); do
  order="${!names[*]}"; [ $((r % 2)) = 0 ] && order=$(printf '%s\n' "${!names[@]}" | tac | tr '\n' ' ')
  for k in $order; do
    a=$(ns)
    posts "${URLS[${names[$k]}]}" "$ADMIT_N" "$tmp/codes" "${KEYS[$k]}"
    b=$(ns)
    bad=$(grep -vc '^201$' "$tmp/codes")
    [ "$bad" = 0 ] || { echo "cluster-bench: $bad of $ADMIT_N POSTs to ${names[$k]} not 201: $(sort "$tmp/codes" | uniq -c | tr '\n' ' ')"; exit 1; }
    awk "BEGIN{printf \"%.1f\\n\", $ADMIT_N / (($b - $a) / 1e9)}" >>"$tmp/a.${names[$k]}"
  done
done
row 'POST /v1/runs admissions/s, PostgreSQL (store + ledger-postgres)' "$(stats "$tmp/a.pg")" \
  'SQLite (store + ledger-sqlite)' "$(stats "$tmp/a.sqlite")" \
  "$(ratio "$(med "$tmp/a.pg")" "$(med "$tmp/a.sqlite")") SQLite"
[ -n "${BENCH_ADMIT_OTHER:-}" ] &&
  row "POST /v1/runs admissions/s, PostgreSQL, $BENCH_ADMIT_OTHER" "$(stats "$tmp/a.other")" \
    'this build on PostgreSQL' "$(stats "$tmp/a.pg")" "$(ratio "$(med "$tmp/a.other")" "$(med "$tmp/a.pg")") this build"
if [ -n "${BENCH_ADMIT_PROFILE:-}" ]; then
  # The statements behind one admission: every statement the server runs while 10 runs are
  # admitted, logged with its connection (store or ledger pool) and duration.
  psql "$ADB" -qc "ALTER SYSTEM SET log_statement = 'all'" -c "ALTER SYSTEM SET log_duration = on" \
    -c "ALTER SYSTEM SET log_line_prefix = '%m [%p] '" -c "SELECT pg_reload_conf()" >/dev/null
  sleep 1
  log=$EPH_TEST_PG_DIR/server.log
  l0=$(wc -l <"$log")
  posts "${URLS[pg]}" 10 "$tmp/codes" "${KEYS[1]}"
  psql "$ADB" -qc "ALTER SYSTEM RESET ALL" -c "SELECT pg_reload_conf()" >/dev/null
  tail -n +"$((l0 + 1))" "$log" >"$BENCH_ADMIT_PROFILE"
  echo "  statements of 10 admissions: $(grep -c 'statement: \|execute ' "$BENCH_ADMIT_PROFILE") in $BENCH_ADMIT_PROFILE"
fi
stop_all

# ---- 2. runs per second with 1, 2 and 3 nodes on one database
NROUNDS=$(( (ROUNDS + 1) / 2 ))
echo "== cluster 2. runs/s with 1, 2, 3 nodes sharing PostgreSQL ($NROUNDS rounds of $RUNS runs, $WORKERS workers per node)"
NDB=$(newdb eph_bench_nodes) || exit 1
srv="server: { max_concurrent_runs = $WORKERS; max_queued_runs = 1000; };"
for n in n1 n2 n3; do config "$tmp/$n" "$NDB" "$srv"; done
CFG=$tmp/n1/cfg/ephemeral.conf STATE=$tmp/n1/state
KEY=$(eph --database "$NDB" keys create --org bench --name bench 2>/dev/null)
eph --database "$NDB" orgs credit bench 1000000000000 >/dev/null
# One psql for the polling (a process per poll would cost the CPU being measured).
coproc PQ { psql "$NDB" -tAq 2>&1; }
PQ_PID=$PQ_PID
settled() {
  echo "SELECT count(*) FROM events WHERE kind = 'settled';" >&"${PQ[1]}"
  local line
  read -r line <&"${PQ[0]}"
  echo "$line"
}
total=0
for r in $(seq "$NROUNDS"); do
  order="1 2 3"; [ $((r % 2)) = 0 ] && order="3 2 1"
  for n in $order; do
    for i in 1 2 3; do
      if [ "$i" -le "$n" ]; then [ -n "${PIDS[n$i]:-}" ] || start "n$i" || exit 1
      else stop_node "n$i"; fi
    done
    node_urls=""
    for i in $(seq "$n"); do node_urls="$node_urls ${URLS[n$i]}"; done
    total=$((total + RUNS))
    a=$(ns)
    posts "$node_urls" "$RUNS" "$tmp/codes" "$KEY"
    [ "$(grep -c '^201$' "$tmp/codes")" = "$RUNS" ] ||
      { echo "cluster-bench: POSTs not all 201: $(sort "$tmp/codes" | uniq -c | tr '\n' ' ')"; exit 1; }
    for _ in $(seq 6000); do
      [ "$(settled)" -ge "$total" ] && break
      sleep 0.02
    done
    b=$(ns)
    [ "$(settled)" -ge "$total" ] || { echo "cluster-bench: runs did not settle within 120 s"; exit 1; }
    awk "BEGIN{printf \"%.2f\\n\", $RUNS / (($b - $a) / 1e9)}" >>"$tmp/r.$n"
  done
done
failed=$(psql "$NDB" -tAqc "SELECT count(*) FROM runs WHERE status <> 'succeeded'")
[ "$failed" = 0 ] || echo "cluster-bench: $failed runs did not succeed"
cpus=$(nproc)
for n in 2 3; do
  row "runs/s of the example, $n nodes on one PostgreSQL ($WORKERS workers each)" "$(stats "$tmp/r.$n")" \
    "1 node ($WORKERS workers)" "$(stats "$tmp/r.1")" \
    "$(ratio "$(med "$tmp/r.$n")" "$(med "$tmp/r.1")") one node (all on $cpus cores: CPU-bound)"
done
exit 0
