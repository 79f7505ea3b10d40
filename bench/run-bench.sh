#!/bin/bash
# bench/run-bench.sh (`make bench`): every figure of issue 17 side by side with its peer, in
# one run, interleaved (A, B, A, B...), as median and min-max; plus callgrind instruction
# counts of the start-up path. Writes a Markdown table to $EPH_BUILDDIR/bench/results.md and
# prints it. Figures only: nothing here passes or fails on speed.
#
#   1. `ephemeral exec -- true` (whole command)  vs  bwrap --unshare-all --die-with-parent
#      --ro-bind / / true: wall-clock, and CPU per command (perf stat task-clock, every
#      process of the command, when perf works); callgrind instructions of each (ours up to
#      the sandbox's clone3, which valgrind does not implement; bwrap's parent process),
#      ours split into the dynamic linker before main(), the configuration and the
#      backend plugin's dlopen() and init
#   2. a run's cost per shell call (a replayed run of 100 `true` calls minus one of 1 call,
#      per call)  vs  the same calls (`sh -c true`) in a loop inside one bwrap sandbox
#      and the same in CPU time (perf stat task-clock of the process tree), when perf exists
#   3. concurrent runs of the example (examples/sandbox-proof, replayed), N = 1, 4, 16:
#      runs/s  vs  N bwrap sandboxes running the example's four commands; and CPU per run
#  3b. the same through one ephemerald with N concurrent clients (POST /v1/runs?wait), and
#      the daemon's own CPU per run
#   4. core overhead per tool call and ledger charges/s (bench/core-overhead); a timeline
#      event committed with 31 others (as a run commits them) against one committed alone
#   5. GET /v1/runs/{id} of an ended run  vs  bench/bare-mhd serving the same bytes (and
#      GET /v1/health), req/s over keep-alive connections (bench/http-bench)
#   6. bench/qemu-bench and bench/ledger-bench (other helpers' benches), when built
#   7. issue 15's cluster figures (bench/cluster-bench.sh, on a throw-away PostgreSQL of
#      tests/with-pg): POST /v1/runs admissions/s on PostgreSQL vs SQLite, and runs/s of the
#      example with 2 and 3 nodes sharing one database as a ratio to one node
#
# Usage: bench/run-bench.sh   as root, from the build tree (EPH_BUILDDIR, EPH_SRCDIR override).
# BENCH_TOOLS: where bare-mhd, http-bench and ledger-bench are (default: EPH_BUILDDIR/bench),
# so an older build tree can be measured with this tree's tools. BENCH_QUICK=1 halves the
# rounds; BENCH_NO_QEMU=1 skips bench/qemu-bench; BENCH_ONLY=exec measures only figure 1
# (seconds, for a change to the CLI's start-up); BENCH_NO_CLUSTER=1 skips section 7 (its
# own knobs, BENCH_CLUSTER_ROUNDS, BENCH_ADMIT_N, BENCH_CLUSTER_RUNS, are in its header) and
# ledger-bench's ledger-postgres column (run under tests/with-pg otherwise);
# BENCH_LEDGER_ROUNDS: ledger-bench's rounds (default 3).
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
EPH_BUILDDIR=${EPH_BUILDDIR:-$(pwd)}
EPH_SRCDIR=${EPH_SRCDIR:-$top}
TOOLS=${BENCH_TOOLS:-$EPH_BUILDDIR/bench}
EPHEMERAL=$EPH_BUILDDIR/ephemeral
OUT=${BENCH_OUT:-$EPH_BUILDDIR/bench/results.md}
ROUNDS=${BENCH_ROUNDS:-15}
[ "${BENCH_QUICK:-}" = 1 ] && ROUNDS=7
[ "$(id -u)" = 0 ] || { echo "bench: needs root (sandboxes)"; exit 1; }
[ -x "$EPHEMERAL" ] || { echo "bench: no $EPHEMERAL: run from the build tree or set EPH_BUILDDIR"; exit 1; }
command -v bwrap >/dev/null || { echo "bench: needs bwrap (apt-get install bubblewrap)"; exit 1; }
tmp=$(mktemp -d /tmp/eph-bench.XXXXXX)
. "$EPH_SRCDIR/tests/tap.sh" >/dev/null
. "$EPH_SRCDIR/tests/daemon-lib.sh"
bare_pid=
trap 'daemon_stop >/dev/null 2>&1; [ -n "$bare_pid" ] && kill "$bare_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
export EPHEMERAL_STATE_DIR=$tmp/state
# The peer of a sandbox that runs commands: /dev and /proc of its own (a command writing to
# /dev/null must work) and the PATH the guest gives a worker.
BWRAP=(bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp
  --chdir /tmp --setenv PATH /usr/local/bin:/usr/bin:/bin)

# The clock is read without a process: $(date +%s%N) forked and exec'd date inside every
# timed region (~1 ms here, on both sides of a ratio, which drew it towards 1).
# (Its decimal point is the locale's: [.,] takes either.)
[ -n "${EPOCHREALTIME:-}" ] || { echo "${0##*/}: needs bash >= 5 (EPOCHREALTIME)"; exit 1; }
# stats FILE: "median (min-max)" of the numbers in FILE, one per line.
stats() {
  python3 -c 'import sys, statistics as s
v = [float(x) for x in open(sys.argv[1]) if x.strip()]
print("%.1f (%.1f-%.1f)" % (s.median(v), min(v), max(v)) if v else "n/a")' "$1"
}
med() { python3 -c 'import sys, statistics as s; v=[float(x) for x in open(sys.argv[1]) if x.strip()]; print(s.median(v) if v else 0)' "$1"; }
ratio() { python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print("%.2fx" % (a / b) if b else "n/a")' "$1" "$2"; }
rows=()
row() { rows+=("| $1 | $2 | $3 | $4 | $5 |"); echo "  $1: $2 | $3: $4 | $5"; }

# transcript N FILE: a replay transcript of N shell calls of `true` (10 per model answer).
transcript() { python3 "$EPH_SRCDIR/bench/transcript.py" "$1" "$2"; }
echo '{"prompt": "calls", "shell": true, "timeout_seconds": 120, "max_cost_micros": 400000}' >"$tmp/req.json"
"$EPHEMERAL" orgs credit cli 1000000000 >/dev/null 2>&1

echo "== 1. exec -- true vs bwrap ($ROUNDS interleaved pairs)"
for i in $(seq "$ROUNDS"); do
  a=${EPOCHREALTIME/[.,]/}000; "$EPHEMERAL" exec -- true >/dev/null 2>"$tmp/exec.err" || { cat "$tmp/exec.err"; exit 1; }; b=${EPOCHREALTIME/[.,]/}000
  bwrap --unshare-all --die-with-parent --ro-bind / / true; c=${EPOCHREALTIME/[.,]/}000
  echo $(( (b - a) / 1000 )) | awk '{print $1/1000}' >>"$tmp/exec"
  echo $(( (c - b) / 1000 )) | awk '{print $1/1000}' >>"$tmp/bwrap"
done
row '`ephemeral exec -- true`, ms' "$(stats "$tmp/exec")" 'bwrap `true`, ms' "$(stats "$tmp/bwrap")" \
  "$(ratio "$(med "$tmp/exec")" "$(med "$tmp/bwrap")") bwrap"
if command -v valgrind >/dev/null; then
  ci=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$EPHEMERAL" exec -- true 2>&1 |
       sed -n 's/.*Collected : \([0-9]*\).*/\1/p' | head -1)
  cb=$(cd "$tmp" && valgrind --tool=callgrind --callgrind-out-file=/dev/null \
       bwrap --unshare-all --die-with-parent --ro-bind / / true 2>&1 |
       sed -n 's/.*Collected : \([0-9]*\).*/\1/p' | head -1)
  row 'start-up instructions to the sandbox clone (callgrind), M' "$(awk "BEGIN{printf \"%.2f\", ${ci:-0}/1e6}")" \
    'bwrap parent, M' "$(awk "BEGIN{printf \"%.2f\", ${cb:-0}/1e6}")" "$(ratio "${ci:-0}" "${cb:-1}")"
  # Where ours go: inclusive counts of the dynamic linker's start-up (dl_main, before
  # main()), the configuration (eph_config_load) and the backend's dlopen() and init
  # (eph_plugin_load_file).
  # (Its status is not ours to check: under valgrind the sandbox's clone3 fails.)
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" "$EPHEMERAL" exec -- true >/dev/null 2>&1
  if command -v callgrind_annotate >/dev/null && [ -s "$tmp/cg.out" ]; then
    callgrind_annotate --inclusive=yes "$tmp/cg.out" 2>/dev/null >"$tmp/cg.txt"
    part() { sed -n "s/^ *\([0-9,]*\) .*[:/]$1 \[.*/\1/p" "$tmp/cg.txt" | head -1 | tr -d ,; }
    dl=$(part 'rtld.c:dl_main'); cf=$(part 'eph_config_load'); be=$(part 'eph_plugin_load_file')
    m() { awk "BEGIN{printf \"%.2f\", ${1:-0}/1e6}"; }
    row 'of which: dynamic linker before main() / config / backend dlopen+init, M' \
      "$(m "$dl") / $(m "$cf") / $(m "$be")" 'bwrap parent, M' "$(m "$cb")" \
      "rest $(m "$(( ${ci:-0} - ${dl:-0} - ${cf:-0} - ${be:-0} ))") M"
  fi
fi
if perf stat -x, -e task-clock -o "$tmp/perf.probe" true 2>/dev/null; then
  : >"$tmp/cpu"; : >"$tmp/cpub"
  for i in $(seq "$ROUNDS"); do
    perf stat -x, -e task-clock -o "$tmp/p1" "$EPHEMERAL" exec -- true >/dev/null 2>&1
    perf stat -x, -e task-clock -o "$tmp/p2" bwrap --unshare-all --die-with-parent --ro-bind / / true
    sed -n 's/^\([0-9.]*\),msec,task-clock.*/\1/p' "$tmp/p1" >>"$tmp/cpu"
    sed -n 's/^\([0-9.]*\),msec,task-clock.*/\1/p' "$tmp/p2" >>"$tmp/cpub"
  done
  row '`exec -- true`, CPU ms per command (perf stat task-clock)' "$(stats "$tmp/cpu")" \
    'bwrap `true`, CPU ms' "$(stats "$tmp/cpub")" "$(ratio "$(med "$tmp/cpu")" "$(med "$tmp/cpub")") bwrap"
fi

others=""
if [ "${BENCH_ONLY:-}" != exec ]; then

echo "== 2. a run's cost per shell call vs a loop in one bwrap"
transcript 100 "$tmp/t100.jsonl"
transcript 1 "$tmp/t1.jsonl"
for i in $(seq $(( (ROUNDS + 4) / 5 ))); do
  a=${EPOCHREALTIME/[.,]/}000; "$EPHEMERAL" run --quiet --replay "$tmp/t100.jsonl" "$tmp/req.json" >/dev/null 2>"$tmp/run.err" ||
    { tail -5 "$tmp/run.err"; exit 1; }; b=${EPOCHREALTIME/[.,]/}000
  "$EPHEMERAL" run --quiet --replay "$tmp/t1.jsonl" "$tmp/req.json" >/dev/null 2>&1; c=${EPOCHREALTIME/[.,]/}000
  echo "$(( (b - a) - (c - b) ))" | awk '{print $1/99/1e6}' >>"$tmp/percall"
  a=${EPOCHREALTIME/[.,]/}000; "${BWRAP[@]}" sh -c 'i=0; while [ $i -lt 100 ]; do sh -c true; i=$((i+1)); done'; b=${EPOCHREALTIME/[.,]/}000
  "${BWRAP[@]}" sh -c 'sh -c true'; c=${EPOCHREALTIME/[.,]/}000
  echo "$(( (b - a) - (c - b) ))" | awk '{print $1/99/1e6}' >>"$tmp/bwcall"
done
row "a run's cost per shell call, ms" "$(stats "$tmp/percall")" 'bwrap loop per `sh -c true`, ms' \
  "$(stats "$tmp/bwcall")" "$(ratio "$(med "$tmp/percall")" "$(med "$tmp/bwcall")") bwrap"
# The same in CPU time (task-clock of the whole process tree, every thread and child): on a
# host shared with other work wall time mostly measures the others; CPU time does not.
if command -v perf >/dev/null; then
  cpu() { perf stat -x, -e task-clock -- "$@" 2>&1 >/dev/null | sed -n 's/^\([0-9.]*\),.*task-clock.*/\1/p'; }
  for i in $(seq $(( (ROUNDS + 4) / 5 ))); do
    a=$(cpu "$EPHEMERAL" run --quiet --replay "$tmp/t100.jsonl" "$tmp/req.json")
    b=$(cpu "$EPHEMERAL" run --quiet --replay "$tmp/t1.jsonl" "$tmp/req.json")
    awk "BEGIN{print ($a - $b) / 99}" >>"$tmp/cpucall"
    a=$(cpu "${BWRAP[@]}" sh -c 'i=0; while [ $i -lt 100 ]; do sh -c true; i=$((i+1)); done')
    b=$(cpu "${BWRAP[@]}" sh -c 'sh -c true')
    awk "BEGIN{print ($a - $b) / 99}" >>"$tmp/bwcpucall"
  done
  row "a run's CPU per shell call (perf stat task-clock), ms" "$(stats "$tmp/cpucall")" \
    'bwrap loop, CPU per `sh -c true`, ms' "$(stats "$tmp/bwcpucall")" \
    "$(ratio "$(med "$tmp/cpucall")" "$(med "$tmp/bwcpucall")") bwrap"
fi

echo "== 3. concurrent runs of the example"
ex=$EPH_SRCDIR/examples/sandbox-proof
cmds=$(python3 -c 'import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)["choices"][0]["message"]
    for c in m.get("tool_calls") or []:
        print(json.loads(c["function"]["arguments"])["command"])' "$ex/transcript.jsonl")
printf '%s\n' "$cmds" >"$tmp/cmds"
CROUNDS=$(( (ROUNDS + 4) / 5 ))
# n_at_once N CMD...: N copies of CMD at once; waits for those only (a daemon may be ours too).
n_at_once() {
  local n=$1 pids="" i
  shift
  for i in $(seq "$n"); do "$@" & pids="$pids $!"; done
  wait $pids
}
bwrap_example() {
  "${BWRAP[@]}" --ro-bind "$tmp/cmds" /tmp/cmds sh -c 'while IFS= read -r c; do sh -c "$c" >/dev/null 2>&1; done </tmp/cmds'
}
cli_example() {
  "$EPHEMERAL" run --quiet --replay "$ex/transcript.jsonl" "$ex/request.json" >/dev/null 2>&1
}
cli_examples() { n_at_once "$1" cli_example; }
# concurrency TAG LABEL FN: for N = 1, 4, 16, CROUNDS rounds of `FN N` (N runs at once) then
# N bwrap_example at once; a row of runs/s each.
concurrency() {
  local tag=$1 label=$2 fn=$3 n k a b c
  for n in 1 4 16; do
    : >"$tmp/$tag.ours.$n"; : >"$tmp/$tag.bw.$n"
    for k in $(seq "$CROUNDS"); do
      a=${EPOCHREALTIME/[.,]/}000; "$fn" "$n"; b=${EPOCHREALTIME/[.,]/}000; n_at_once "$n" bwrap_example; c=${EPOCHREALTIME/[.,]/}000
      awk "BEGIN{printf \"%.1f\\n\", $n / (($b - $a) / 1e9)}" >>"$tmp/$tag.ours.$n"
      awk "BEGIN{printf \"%.1f\\n\", $n / (($c - $b) / 1e9)}" >>"$tmp/$tag.bw.$n"
    done
    row "${label/N=/N=$n}, runs/s" "$(stats "$tmp/$tag.ours.$n")" \
      "bwrap doing the same commands, runs/s" "$(stats "$tmp/$tag.bw.$n")" \
      "$(ratio "$(med "$tmp/$tag.ours.$n")" "$(med "$tmp/$tag.bw.$n")") bwrap"
  done
}
concurrency c "concurrent runs of the example, N=" cli_examples
# CPU per run of the example (what bounds runs/s once the cores are busy), interleaved.
if command -v perf >/dev/null; then
  for k in $(seq "$ROUNDS"); do
    cpu "$EPHEMERAL" run --quiet --replay "$ex/transcript.jsonl" "$ex/request.json" >>"$tmp/cpurun"
    cpu "${BWRAP[@]}" --ro-bind "$tmp/cmds" /tmp/cmds sh -c 'while IFS= read -r c; do sh -c "$c" >/dev/null 2>&1; done </tmp/cmds' >>"$tmp/bwcpurun"
  done
  row "CPU per run of the example (perf stat task-clock), ms" "$(stats "$tmp/cpurun")" \
    "bwrap doing the same commands, CPU ms" "$(stats "$tmp/bwcpurun")" \
    "$(ratio "$(med "$tmp/bwcpurun")" "$(med "$tmp/cpurun")") bwrap (runs per CPU second)"
fi

echo "== 3b. concurrent runs of the example through ephemerald (N connections)"
# What a service's users run: one daemon (process start-up, configuration, plugins and the
# store opened once), N kept-alive connections of one warm client (bench/client.py: N curl
# processes would charge the row with N client start-ups, ~6.5 ms of CPU each, that bwrap's
# row has not) each POSTing the example and waiting for its end (?wait=60),
# against the same N bwrap sandboxes as above, interleaved. Both rows are kept: the CLI row
# above is N `ephemeral run` processes.
daemon_config "$tmp/dc" "server: { max_concurrent_runs = 16; max_queued_runs = 256; };"
DKEY=$(new_key benchc benchc)
eph orgs credit benchc 1000000000 >/dev/null
sed 's|^{|{"model": "replay:'"$ex"'/transcript.jsonl", |' "$ex/request.json" >"$tmp/req-c.json"
if daemon_start >/dev/null; then
  # One warm client (bench/client.py: N kept-alive connections, as an SDK's pool) told N on a
  # FIFO and answering the N status codes: no client start-up inside the timed loop.
  mkfifo "$tmp/cin" "$tmp/cout"
  python3 "$EPH_SRCDIR/bench/client.py" "$URL" "$DKEY" "$tmp/req-c.json" <"$tmp/cin" >"$tmp/cout" &
  CPID=$!
  exec {CTO}>"$tmp/cin" {CFROM}<"$tmp/cout"
  post_runs() { # N runs at once through the warm client
    local codes
    echo "$1" >&"$CTO"
    read -r codes <&"$CFROM"
    printf '%s\n' $codes >>"$tmp/dcodes"
  }
  post_runs 1 # warm: the first run loads the plugins it needs
  concurrency d "runs of the example through ephemerald, N= connections of a warm client" post_runs
  bad=$(grep -vc '^201$' "$tmp/dcodes" || true)
  [ "$bad" = 0 ] || echo "  (ephemerald answered $bad of the POSTs with something else than 201)"
  # The daemon's own CPU per run (its threads: HTTP, store, ledger, guest protocol, the
  # sandbox's clone), from /proc, over the runs above.
  ticks=$(awk '{print $14 + $15}' "/proc/$DPID/stat")
  nruns=$(grep -c '^201$' "$tmp/dcodes")
  row "ephemerald's own CPU per run (its threads, not the sandboxes), ms" \
    "$(awk "BEGIN{printf \"%.1f\", $ticks * 1000 / $(getconf CLK_TCK) / $nruns}")" \
    "bwrap's whole CPU per run (above), ms" "$([ -s "$tmp/bwcpurun" ] && med "$tmp/bwcpurun" || echo n/a)" \
    "over $nruns runs"
  exec {CTO}>&- {CFROM}<&-
  wait "$CPID" 2>/dev/null
  daemon_stop >/dev/null 2>&1
fi

echo "== 4. core overhead per tool call, ledger charges/s"
CORE_OVERHEAD=${BENCH_CORE_OVERHEAD:-$EPH_BUILDDIR/bench/core-overhead}
if [ -x "$CORE_OVERHEAD" ]; then
  (cd "$EPH_BUILDDIR" && EPHEMERAL_CONFIG=$EPH_CONF "$CORE_OVERHEAD" 300) >"$tmp/core" 2>&1
  sed 's/^/  /' "$tmp/core"
  core=$(sed -n 's/.*p50): \([0-9.]*\) us = .*/\1/p' "$tmp/core")
  bare=$(sed -n 's/^bare guest exec *p50 *\([0-9.]*\) us.*/\1/p' "$tmp/core")
  lp50=$(sed -n 's/^ledger charge *p50 *\([0-9.]*\) us.*/\1/p' "$tmp/core")
  lps=$(sed -n 's/^ledger charges *\([0-9]*\) \/s.*/\1/p' "$tmp/core")
  [ -z "$lps" ] && [ -n "$lp50" ] && lps=$(awk "BEGIN{printf \"%.0f\", 1e6 / $lp50}")
  row "core overhead per tool call (gate + ledger + event), p50 us" "${core:-n/a}" \
    "bare guest exec, p50 us" "${bare:-n/a}" "ledger charge p50 ${lp50:-n/a} us"
  row "ledger charges/s" "${lps:-n/a}" "goal" "5000" "$(ratio "${lps:-0}" 5000) goal"
  ev1=$(sed -n 's/^event store append *p50 *\([0-9.]*\) us.*/\1/p' "$tmp/core")
  evb=$(sed -n 's/^event, batched x32 *p50 *\([0-9.]*\) us.*/\1/p' "$tmp/core")
  [ -n "$ev1" ] && [ -n "$evb" ] &&
    row "a timeline event in the store, committed 32 per transaction (core/evqueue.c), p50 us per event" \
      "$evb" "the same event in a transaction of its own (the old way), p50 us" "$ev1" \
      "$(ratio "$evb" "$ev1") of one alone"
fi

echo "== 5. GET /v1/runs/{id} vs a bare libmicrohttpd server"
if [ -x "$TOOLS/http-bench" ] && [ -x "$TOOLS/bare-mhd" ]; then
  daemon_config "$tmp/d"
  KEY=$(new_key bench bench)
  eph orgs credit bench 1000000 >/dev/null
  sed 's|^{|{"model": "replay:'"$ex"'/transcript.jsonl", |' "$ex/request.json" >"$tmp/req-d.json"
  rid=$(eph run --json --org bench "$tmp/req-d.json" 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  daemon_start >/dev/null
  curl -sS -o "$tmp/body.json" "$URL/v1/runs/$rid" -H "Authorization: Bearer $KEY"
  coproc BARE { "$TOOLS/bare-mhd" "$tmp/body.json"; }
  bare_pid=$BARE_PID
  read -r line <&"${BARE[0]}"
  BURL=${line#listening on }
  secs=${BENCH_HTTP_SECONDS:-3}
  for i in 1 2 3; do
    "$TOOLS/http-bench" "$URL/v1/runs/$rid" "$secs" 4 "Authorization: Bearer $KEY" | cut -d' ' -f1 >>"$tmp/get"
    "$TOOLS/http-bench" "$BURL/" "$secs" 4 | cut -d' ' -f1 >>"$tmp/bare"
    "$TOOLS/http-bench" "$URL/v1/health" "$secs" 4 | cut -d' ' -f1 >>"$tmp/health"
  done
  row 'GET /v1/runs/{id} (ended run), req/s' "$(stats "$tmp/get")" 'bare libmicrohttpd, same bytes, req/s' \
    "$(stats "$tmp/bare")" "$(ratio "$(med "$tmp/get")" "$(med "$tmp/bare")") bare"
  row 'GET /v1/health, req/s' "$(stats "$tmp/health")" 'bare libmicrohttpd, req/s' \
    "$(stats "$tmp/bare")" "$(ratio "$(med "$tmp/health")" "$(med "$tmp/bare")") bare"
  eval "exec ${BARE[1]}>&-"
  wait "$bare_pid" 2>/dev/null
  bare_pid=
  daemon_stop >/dev/null 2>&1
fi

echo "== 6. other benches"
others=""
if [ -x "$EPH_SRCDIR/bench/qemu-bench" ] && [ -z "${BENCH_NO_QEMU:-}" ]; then
  others="$others"$'\n'"### bench/qemu-bench"$'\n```\n'"$(timeout 240 sh "$EPH_SRCDIR/bench/qemu-bench" "${BENCH_QEMU_N:-3}" 2>&1 | tail -45)"$'\n```'
fi
if [ -x "$TOOLS/ledger-bench" ]; then
  # Under tests/with-pg (when PostgreSQL is installed) ledger-postgres is measured beside
  # ledger-sqlite; without it only ledger-sqlite.
  withpg=
  [ -z "${BENCH_NO_CLUSTER:-}" ] && [ -x "$EPH_SRCDIR/tests/with-pg" ] &&
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && withpg=$EPH_SRCDIR/tests/with-pg
  others="$others"$'\n'"### bench/ledger-bench"$'\n```\n'"$(timeout 120 $withpg "$TOOLS/ledger-bench" --rounds "${BENCH_LEDGER_ROUNDS:-3}" 2>&1 | tail -20)"$'\n```'
fi

echo "== 7. cluster: admissions on PostgreSQL vs SQLite, runs/s with 1, 2, 3 nodes"
if [ -z "${BENCH_NO_CLUSTER:-}" ] && [ -x "$EPH_SRCDIR/tests/with-pg" ]; then
  : >"$tmp/cluster-rows"
  [ "${BENCH_QUICK:-}" = 1 ] && export BENCH_CLUSTER_ROUNDS=${BENCH_CLUSTER_ROUNDS:-3}
  (cd "$EPH_BUILDDIR" && timeout 150 "$EPH_SRCDIR/tests/with-pg" \
    bash "$EPH_SRCDIR/bench/cluster-bench.sh" "$tmp/cluster-rows") 2>&1 | sed 's/^/  /'
  while IFS= read -r line; do rows+=("$line"); done <"$tmp/cluster-rows"
fi

fi # BENCH_ONLY

mkdir -p "$(dirname "$OUT")"
{
  echo "# ephemeral benchmarks ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
  echo
  echo "Median (min-max) of interleaved rounds; peer measured in the same run."
  echo
  echo "| figure | ephemeral | peer | peer figure | ratio |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  [ -n "$others" ] && printf '%s\n' "$others"
} >"$OUT"
echo
cat "$OUT"
