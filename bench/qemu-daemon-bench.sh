#!/bin/bash
# bench/qemu-daemon-bench.sh: "microVM ready" as ephemerald's own log states it, two daemons
# side by side (backend-qemu, TCG, one with `pool = 0`, one with `pool = 1`), N rounds of one
# replayed run (the sandbox-proof transcript: four shell calls in the guest) on each, in
# turn; the first two runs of each daemon (snapshot build, the pool's start) are not
# counted. Prints the median (min-max) of each. Figures only, never a test.
# usage: bench/qemu-daemon-bench.sh [N]   (as root, from the build tree; bench/qemu-bench runs it)
set -u
N=${1:-10}
top=$(cd "$(dirname "$0")/.." && pwd)
EPH_BUILDDIR=${EPH_BUILDDIR:-$top}
EPH_SRCDIR=${EPH_SRCDIR:-$top}
EPHEMERAL=$EPH_BUILDDIR/ephemeral
EPH_CONF=$EPH_SRCDIR/ephemeral.conf
EPH_CONFD=$EPH_SRCDIR/conf.d
. "$EPH_SRCDIR/tests/qemu-image.sh" >/dev/null || exit 0
IMAGE=$STATE/guest-image
. "$EPH_SRCDIR/tests/daemon-lib.sh"
tmp=$(mktemp -d /tmp/eph-qemu-daemon-bench.XXXXXX)
pids=
trap 'for p in $pids; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
body='{"prompt":"bench","shell":true,"timeout_seconds":120,"max_cost_micros":40000}'
for pool in 0 1; do # one daemon each: its CFG, STATE, DLOG, URL, KEY saved by pool size
  daemon_config "$tmp/p$pool" 'server: { max_concurrent_runs = 1; };'
  rm "$tmp/p$pool/cfg/conf.d"
  mkdir "$tmp/p$pool/cfg/conf.d"
  cp "$EPH_CONFD"/*.conf "$tmp/p$pool/cfg/conf.d/"
  sed -i 's/^backend = .*/backend = "backend-qemu";/' "$CFG"
  sed -i -e "s|^  image_dir = [^;]*;|  image_dir = \"$IMAGE\";|" -e "s|^  pool = [^;]*;|  pool = $pool;|" \
    -e 's|^  tsc_khz = [^;]*;|  tsc_khz = 2595000;|' "$tmp/p$pool/cfg/conf.d/11-backend-qemu.conf"
  key=$(new_key bench bench)
  eph orgs credit bench 100000000000 >/dev/null
  daemon_start || exit 1
  pids="$pids $DPID"
  eval "URL$pool=\$URL KEY$pool=\$key DLOG$pool=\$DLOG"
done
run() { curl -sS -o /dev/null -X POST "$1/v1/runs?wait=150" -H "Authorization: Bearer $2" \
  -H "Content-Type: application/json" -d "$body"; }
for i in $(seq $((N + 2))); do
  run "$URL0" "$KEY0"
  run "$URL1" "$KEY1"
done
col() { sed -n 's/.*microVM ready in \([0-9]*\) ms.*/\1/p' "$1" | tail -n +3 | sort -n |
  awk '{ a[NR] = $1 } END { printf "%d (%d-%d)", a[int((NR + 1) / 2)], a[1], a[NR] }'; }
echo "ephemerald, microVM ready (its log), $N interleaved runs each, ms median (min-max)"
printf '%-12s %-20s %-20s\n' "" "pool = 0" "pool = 1"
printf '%-12s %-20s %-20s\n' "ready" "$(col "$DLOG0")" "$(col "$DLOG1")"
