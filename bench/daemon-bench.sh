#!/bin/bash
# ephemerald on loopback, figures side by side with a peer:
#   1. GET /v1/runs/{id} (auth + store read) against GET /v1/health (the HTTP floor: no
#      auth, no store), wrk, 64 connections, 2 threads: requests/s and p99.
#   2. POST /v1/runs accepted per second up to the queue bound (curl --parallel, 64 at a
#      time): every answer must be 201 (zero errors).
#   3. The daemon's RSS at start, after 1,000 and after RUNS (default 10,000) settled runs:
#      runs leave memory once settled, so RSS must not grow with history (the store does).
# Runs use the replay model and shell off (the gate denies the recorded shell calls), so a
# run is a real jail sandbox created and destroyed plus three replayed model calls.
# Usage: bench/daemon-bench.sh [RUNS]   from the build tree, as root; needs wrk and curl.
set -eu
RUNS=${1:-10000}
top=$(cd "$(dirname "$0")/.." && pwd)
EPH_BUILDDIR=${EPH_BUILDDIR:-$top}
EPH_SRCDIR=${EPH_SRCDIR:-$top}
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk"; exit 1; }
tmp=$(mktemp -d /tmp/eph-daemon-bench.XXXXXX)
EPHEMERAL=$EPH_BUILDDIR/ephemeral
. "$EPH_SRCDIR/tests/daemon-lib.sh"
trap 'daemon_stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
QUEUE=${QUEUE:-2000}
daemon_config "$tmp" "server: { max_concurrent_runs = 4; max_queued_runs = $QUEUE; };"
KEY=$(new_key bench bench)
eph orgs credit bench 100000000000 >/dev/null
daemon_start >/dev/null
rss() { awk '/^VmRSS/ {print $2 " kB"}' "/proc/$DPID/status"; }
rss_start=$(rss)
body='{"prompt":"bench","shell":false,"timeout_seconds":60,"max_cost_micros":40000}'
idle() { # waits until nothing is queued or running
  for _ in $(seq 36000); do
    curl -s "$URL/v1/health" | grep -q '"queued":0,"running":0' && return 0
    sleep 0.1
  done
  return 1
}
id=$(curl -sS -X POST "$URL/v1/runs?wait=60" -H "Authorization: Bearer $KEY" \
  -H "Content-Type: application/json" -d "$body" | sed -n 's/.*"id":"\(run_[0-9a-f]*\)".*/\1/p')
sleep 6 # the run leaves memory: GET reads the store

wrk_line() { # wrk_line NAME URL [AUTH]
  local out
  if [ -n "${3:-}" ]; then
    out=$(wrk -t2 -c64 -d10s --latency -H "Authorization: Bearer $3" "$2")
  else
    out=$(wrk -t2 -c64 -d10s --latency "$2")
  fi
  local rps p99 errs
  rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
  errs=$(echo "$out" | awk '/Non-2xx/ {print $NF} /Socket errors/ {print}' | tr '\n' ' ')
  printf '  %-34s %12s req/s   p99 %8s   %s\n' "$1" "$rps" "$p99" "${errs:-no errors}"
}
echo "ephemerald $(date -u +%F) on $(nproc) cores, 64 connections, 10 s each (wrk):"
wrk_line "GET /v1/health (peer: HTTP floor)" "$URL/v1/health"
wrk_line "GET /v1/runs/{id} (auth + store)" "$URL/v1/runs/$id" "$KEY"

# POST up to the queue bound: QUEUE + 4 runs fit (queued + running).
n=$QUEUE
# One transfer per 8 lines; "next" separates them (a trailing one would be an empty transfer).
for i in $(seq "$n"); do
  [ "$i" -gt 1 ] && echo next
  printf 'url = "%s/v1/runs"\nrequest = "POST"\nheader = "Authorization: Bearer %s"\n' "$URL" "$KEY"
  printf 'header = "Content-Type: application/json"\ndata = "%s"\noutput = "/dev/null"\n' "${body//\"/\\\"}"
  printf 'write-out = "%%{http_code}\\n"\n'
done >"$tmp/post.cfg"
s=$(date +%s%N)
curl -sS -Z --parallel-max 64 -K "$tmp/post.cfg" >"$tmp/codes" 2>/dev/null || true
e=$(date +%s%N)
ok=$(grep -c '^201$' "$tmp/codes" || true)
bad=$(grep -vc '^201$' "$tmp/codes" || true)
ms=$(( (e - s) / 1000000 ))
printf '  %-34s %12s runs/s   (%d accepted in %d ms, %d errors)\n' "POST /v1/runs (queue bound $QUEUE)" \
  "$(( ok * 1000 / (ms > 0 ? ms : 1) ))" "$ok" "$ms" "$bad"
s=$(date +%s%N)
idle
e=$(date +%s%N)
printf '  %-34s %12s runs/s   (%d runs executed in %d s by 4 workers)\n' "runs executed (jail sandboxes)" \
  "$(( ok * 1000000000 / (e - s) ))" "$ok" "$(( (e - s) / 1000000000 ))"
rss_1k=$(rss)
done_runs=$((ok + 1))
while [ "$done_runs" -lt "$RUNS" ]; do
  batch=$(( RUNS - done_runs < QUEUE ? RUNS - done_runs : QUEUE ))
  head -n $(( batch * 8 - 1 )) "$tmp/post.cfg" >"$tmp/batch.cfg"
  curl -sS -Z --parallel-max 64 -K "$tmp/batch.cfg" >"$tmp/codes" 2>/dev/null || true
  done_runs=$(( done_runs + $(grep -c '^201$' "$tmp/codes" || true) ))
  idle
done
sleep 6 # the last runs leave memory
printf '  %-34s start %s, after %d runs %s, after %d runs %s (store %s)\n' "daemon RSS" "$rss_start" \
  "$((ok + 1))" "$rss_1k" "$done_runs" "$(rss)" "$(du -sh "$STATE/ephemeral.sqlite" | cut -f1)"
curl -s "$URL/metrics" | grep -E '^ephemeral_runs_(in_memory|ended_total\{status="(succeeded|failed)"\})'
