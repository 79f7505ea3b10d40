#!/bin/bash
# Cluster latencies, this build side by side with a peer build (e.g. the commit before the
# LISTEN connection), interleaved round by round, median (min-max):
#   1. admission -> claim: a run POSTed to node A (busy) and claimed by node B (idle), from
#      its queue row's insert to its delete (both stamped by PostgreSQL: clock_timestamp()
#      in a trigger the benchmark adds to its own throw-away database);
#   2. remote SSE event latency: an SSE stream on A follows the run executing on B; each
#      event from its insert (trigger) to its arrival at the client (same host, same clock),
#      the round's median.
# Each build gets its own database and two nodes (max_concurrent_runs = 1, A kept busy by a
# long run); the runs are replayed shell calls in a real jail sandbox (sleep 0.2).
# Usage, from this build tree, as root:
#   tests/with-pg bench/cluster-latency.sh PEER_BUILDDIR [ROUNDS]   (default 20 rounds)
set -eu
PEER=${1:?usage: tests/with-pg bench/cluster-latency.sh PEER_BUILDDIR [ROUNDS]}
ROUNDS=${2:-20}
top=$(cd "$(dirname "$0")/.." && pwd)
export EPH_BUILDDIR=${EPH_BUILDDIR:-$PWD} EPH_SRCDIR=${EPH_SRCDIR:-$top}
[ -n "${EPH_TEST_DATABASE:-}" ] || { echo "run it under tests/with-pg"; exit 1; }
. "$EPH_SRCDIR/tests/tap.sh"
. "$EPH_SRCDIR/tests/daemon-lib.sh"
tmp=$(mktemp -d /tmp/eph-cluster-latency.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait; rm -rf "$tmp"' EXIT
createdb ephemeral_peer
declare -A DBS=([this]=$EPH_TEST_DATABASE [peer]=${EPH_TEST_DATABASE/\/ephemeral_test/\/ephemeral_peer})
declare -A BUILDS=([this]=$EPH_BUILDDIR [peer]=$(cd "$PEER" && pwd))
declare -A A_URL KEYS
sed "s/sleep 30; echo woke/sleep 0.2; echo done/" "$EPH_SRCDIR/tests/transcripts/sleep.jsonl" >"$tmp/short.jsonl"
sed "s/sleep 30; echo woke/sleep 890; echo done/" "$EPH_SRCDIR/tests/transcripts/sleep.jsonl" >"$tmp/long.jsonl"
body() { echo '{"prompt":"sleep","model":"replay:'"$tmp/$1"'.jsonl","shell":true,"timeout_seconds":900,"max_cost_micros":40000}'; }

for side in this peer; do
  db=${DBS[$side]}
  EPHEMERAL=${BUILDS[$side]}/ephemeral EPHEMERALD=${BUILDS[$side]}/ephemerald
  for n in A B; do
    daemon_config "$tmp/$side/$n" "database = \"$db\"; node_name = \"$side-$n\";
server: { max_concurrent_runs = 1; max_queued_runs = 8; };"
    rm "$tmp/$side/$n/cfg/conf.d"
    mkdir "$tmp/$side/$n/cfg/conf.d"
    cp "$EPH_CONFD"/*.conf "$tmp/$side/$n/cfg/conf.d/"
    sed -i "s|^\(\s*\)# path = .*|\1path = \"$tmp/$side-ledger.sqlite\";|" "$tmp/$side/$n/cfg/conf.d/"*ledger-sqlite*.conf
    if [ $n = A ]; then
      eph --database "$db" db migrate >/dev/null
      KEYS[$side]=$(eph --database "$db" keys create --org bench --name bench 2>/dev/null)
      eph --database "$db" orgs credit bench 100000000000 >/dev/null 2>&1
      psql "$db" -qtA >/dev/null <<'SQL'
CREATE TABLE bench_log (kind TEXT, run_id TEXT, seq BIGINT, at_us BIGINT);
CREATE FUNCTION bench_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_TABLE_NAME = 'events' THEN
    INSERT INTO bench_log VALUES ('event', NEW.run_id, NEW.seq,
      (extract(epoch FROM clock_timestamp()) * 1e6)::bigint);
  ELSIF TG_OP = 'INSERT' THEN
    INSERT INTO bench_log VALUES ('push', NEW.run_id, NULL,
      (extract(epoch FROM clock_timestamp()) * 1e6)::bigint);
  ELSE
    INSERT INTO bench_log VALUES ('claim', OLD.run_id, NULL,
      (extract(epoch FROM clock_timestamp()) * 1e6)::bigint);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER bench_queue AFTER INSERT OR DELETE ON run_queue
  FOR EACH ROW EXECUTE FUNCTION bench_stamp();
CREATE TRIGGER bench_events AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION bench_stamp();
SQL
    fi
    daemon_start >/dev/null
    PIDS+=("$DPID")
    [ $n = A ] && A_URL[$side]=$URL
    if [ $n = A ]; then # A busy for the whole benchmark
      curl -sS -o "$tmp/long-$side.json" -X POST "$URL/v1/runs" -H "Authorization: Bearer ${KEYS[$side]}" \
        -H "Content-Type: application/json" -d "$(body long)"
      id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$tmp/long-$side.json") ||
        { cat "$tmp/long-$side.json" "$DLOG" >&2; exit 1; }
      for _ in $(seq 600); do
        [ "$(psql "$db" -tAqc "SELECT status FROM runs WHERE id = '$id'")" = running ] && break
        sleep 0.1
      done
    fi
  done
done

# one round: POST to A, follow on A with SSE; prints "claim_ms sse_median_ms"
round() {
  local side=$1 db=${DBS[$1]}
  python3 - "${A_URL[$side]}" "${KEYS[$side]}" "$(body short)" "$db" <<'PY'
import json, subprocess, sys, time, urllib.request, statistics
url, key, body, db = sys.argv[1:5]
h = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
r = json.load(urllib.request.urlopen(urllib.request.Request(url + "/v1/runs", body.encode(), h)))
rid = r["id"]
got = {}
seq = None
with urllib.request.urlopen(urllib.request.Request(url + "/v1/runs/" + rid + "/events", headers=h)) as s:
    for line in s:
        line = line.decode().rstrip("\n")
        if line.startswith("id: "):
            seq = int(line[4:])
        elif line.startswith("data: ") and seq is not None:
            got[seq] = time.time() * 1e6
        elif line.startswith("event: settled"):
            pass
        if line.startswith("data: ") and '"kind":"settled"' in line:
            break
q = lambda sql: subprocess.run(["psql", db, "-tAqc", sql], capture_output=True, text=True).stdout.split()
push, claim = (int(v) for v in q("SELECT (SELECT at_us FROM bench_log WHERE kind = 'push' AND run_id = '%s'), (SELECT at_us FROM bench_log WHERE kind = 'claim' AND run_id = '%s')" % (rid, rid))[0].split("|"))
lat = []
for row in q("SELECT seq || '|' || at_us FROM bench_log WHERE kind = 'event' AND run_id = '%s' AND seq >= 2" % rid):
    sq, at = (int(v) for v in row.split("|"))
    if sq in got:
        lat.append((got[sq] - at) / 1000)
print("%.2f %.2f" % ((claim - push) / 1000, statistics.median(lat)))
PY
}

declare -A CLAIM SSE
for side in this peer; do CLAIM[$side]=""; SSE[$side]=""; done
for i in $(seq "$ROUNDS"); do
  for side in this peer; do
    read -r c s < <(round "$side")
    CLAIM[$side]+="$c "
    SSE[$side]+="$s "
  done
done
stats() { python3 -c 'import sys, statistics as st; v=[float(x) for x in sys.argv[1:]]; print("%8.1f ms (%.1f-%.1f)" % (st.median(v), min(v), max(v)))' $1; }
echo "cluster latencies $(date -u +%F), $(nproc) cores, $ROUNDS interleaved rounds, median (min-max):"
printf '  %-44s %-26s %-26s\n' "" "this ($(git -C "$EPH_SRCDIR" rev-parse --short HEAD 2>/dev/null || echo build))" "peer ($PEER)"
printf '  %-44s %-26s %-26s\n' "admission on busy A -> claim by idle B" "$(stats "${CLAIM[this]}")" "$(stats "${CLAIM[peer]}")"
printf '  %-44s %-26s %-26s\n' "event on B -> SSE client on A (round median)" "$(stats "${SSE[this]}")" "$(stats "${SSE[peer]}")"
