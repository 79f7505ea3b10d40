#!/bin/bash
# bench/compare.sh OLD_BUILDDIR [NEW_BUILDDIR]: issue 17's sandbox figures for two builds and
# bubblewrap, interleaved in one loop (old, new, bwrap in turn, so all three see the same
# machine load), as median (min-max) and the ratios to bwrap. For judging a change: build the
# code before it in a second tree (e.g. `git worktree add ../base main`, configure and make
# there without sanitizers) and run this from the new tree, as root:
#
#   bench/compare.sh ../base/_b          (NEW_BUILDDIR defaults to the current directory;
#                                         one build twice, e.g. `bench/compare.sh . .`, shows the noise)
#
#   1. `ephemeral exec -- true`, wall ms and CPU ms (perf stat task-clock, every process)
#   2. a run's cost per shell call: (replayed run of 100 `true` calls - one of 1) / 99, wall
#      and CPU, against a loop of `sh -c true` in one bwrap sandbox
#   3. concurrent runs of examples/sandbox-proof, N = 1, 4, 16: N `ephemeral run` processes,
#      and N kept-alive connections of one warm client (bench/client.py) to one ephemerald
#      per build (POST /v1/runs?wait), against N bwrap sandboxes running the example's
#      commands
# Knobs: CMP_EXEC_ROUNDS (default 41), CMP_CALL_ROUNDS (7), CMP_RUN_ROUNDS (5), CMP_ONLY=exec.
# Figures only: nothing here passes or fails on speed.
set -u
OLD=$(cd "${1:?usage: bench/compare.sh OLD_BUILDDIR [NEW_BUILDDIR]}" && pwd)
NEW=$(cd "${2:-.}" && pwd)
top=$(cd "$(dirname "$0")/.." && pwd)
export EPH_BUILDDIR=$NEW EPH_SRCDIR=${EPH_SRCDIR:-$top}
[ "$(id -u)" = 0 ] || { echo "compare: needs root (sandboxes)"; exit 1; }
for b in "$OLD" "$NEW"; do
  [ -x "$b/ephemeral" ] || { echo "compare: no $b/ephemeral"; exit 1; }
done
command -v bwrap >/dev/null || { echo "compare: needs bwrap"; exit 1; }
. "$EPH_SRCDIR/tests/tap.sh" >/dev/null
tmp=$(mktemp -d /tmp/eph-compare.XXXXXX)
dpids=()
trap 'for p in "${dpids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
BWRAP=(bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp
  --chdir /tmp --setenv PATH /usr/local/bin:/usr/bin:/bin)
# The clock is read without a process: $(date +%s%N) forked and exec'd date inside every
# timed region (~1 ms here, on both sides of a ratio, which drew it towards 1).
# (Its decimal point is the locale's: [.,] takes either.)
[ -n "${EPOCHREALTIME:-}" ] || { echo "${0##*/}: needs bash >= 5 (EPOCHREALTIME)"; exit 1; }
have_perf=0
perf stat -x, -e task-clock -o "$tmp/probe" true 2>/dev/null && have_perf=1
cpu() { perf stat -x, -e task-clock -- "$@" 2>&1 >/dev/null | sed -n 's/^\([0-9.]*\),.*task-clock.*/\1/p'; }
stats() {
  python3 -c 'import sys, statistics as s
v = [float(x) for x in open(sys.argv[1]) if x.strip()]
print("%.2f (%.2f-%.2f)" % (s.median(v), min(v), max(v)) if v else "n/a")' "$1"
}
ratio() {
  python3 -c 'import sys, statistics as s
m = lambda p: s.median([float(x) for x in open(p) if x.strip()])
a, b = m(sys.argv[1]), m(sys.argv[2]); print("%.2fx" % (a / b) if b else "n/a")' "$1" "$2"
}
rows=()
row() { # NAME FILE_OLD FILE_NEW FILE_BWRAP
  local r="| $1 | $(stats "$2") | $(stats "$3") | $(stats "$4") | $(ratio "$2" "$4") | $(ratio "$3" "$4") |"
  rows+=("$r")
  echo "  $r"
}
for b in old new; do mkdir -p "$tmp/$b/state"; done
# Builds by label, not by path: the same directory may be given twice (a build against
# itself shows the run-to-run noise); each label has its own state and daemon.
declare -A BUILD=([old]=$OLD [new]=$NEW)
st() { echo "$tmp/$1/state"; }

echo "== 1. exec -- true"
R=${CMP_EXEC_ROUNDS:-41}
for i in $(seq "$R"); do
  for n in old new; do
    b=${BUILD[$n]}
    s=$(st "$n") # outside the timed region: a $(...) forks a subshell
    a=${EPOCHREALTIME/[.,]/}000; EPHEMERAL_STATE_DIR=$s "$b/ephemeral" exec -- true >/dev/null 2>&1; c=${EPOCHREALTIME/[.,]/}000
    echo "$(( (c - a) / 1000 ))" | awk '{print $1/1000}' >>"$tmp/exec.$n"
  done
  a=${EPOCHREALTIME/[.,]/}000; bwrap --unshare-all --die-with-parent --ro-bind / / true; c=${EPOCHREALTIME/[.,]/}000
  echo "$(( (c - a) / 1000 ))" | awk '{print $1/1000}' >>"$tmp/exec.bw"
  if [ $have_perf = 1 ]; then
    for n in old new; do
      b=${BUILD[$n]}
      EPHEMERAL_STATE_DIR=$(st "$n") cpu "$b/ephemeral" exec -- true >>"$tmp/execcpu.$n"
    done
    cpu bwrap --unshare-all --die-with-parent --ro-bind / / true >>"$tmp/execcpu.bw"
  fi
done
row '`ephemeral exec -- true`, ms ('"$R"' rounds)' "$tmp/exec.old" "$tmp/exec.new" "$tmp/exec.bw"
[ $have_perf = 1 ] && row '`exec -- true`, CPU ms (perf stat task-clock)' "$tmp/execcpu.old" \
  "$tmp/execcpu.new" "$tmp/execcpu.bw"

if [ "${CMP_ONLY:-}" != exec ]; then
  echo "== 2. per shell call"
  python3 "$EPH_SRCDIR/bench/transcript.py" 100 "$tmp/t100.jsonl"
  python3 "$EPH_SRCDIR/bench/transcript.py" 1 "$tmp/t1.jsonl"
  echo '{"prompt": "calls", "shell": true, "timeout_seconds": 120, "max_cost_micros": 400000}' >"$tmp/req.json"
  for n in old new; do
    b=${BUILD[$n]}
    EPHEMERAL_STATE_DIR=$(st "$n") "$b/ephemeral" orgs credit cli 1000000000 >/dev/null 2>&1
  done
  loop='i=0; while [ $i -lt 100 ]; do sh -c true; i=$((i+1)); done'
  R=${CMP_CALL_ROUNDS:-7}
  for i in $(seq "$R"); do
    for n in old new; do
      b=${BUILD[$n]}
      export EPHEMERAL_STATE_DIR=$(st "$n")
      a=${EPOCHREALTIME/[.,]/}000; "$b/ephemeral" run --quiet --replay "$tmp/t100.jsonl" "$tmp/req.json" >/dev/null 2>&1; m=${EPOCHREALTIME/[.,]/}000
      "$b/ephemeral" run --quiet --replay "$tmp/t1.jsonl" "$tmp/req.json" >/dev/null 2>&1; c=${EPOCHREALTIME/[.,]/}000
      echo "$(( (m - a) - (c - m) ))" | awk '{print $1/99/1e6}' >>"$tmp/call.$n"
      if [ $have_perf = 1 ]; then
        x=$(cpu "$b/ephemeral" run --quiet --replay "$tmp/t100.jsonl" "$tmp/req.json")
        y=$(cpu "$b/ephemeral" run --quiet --replay "$tmp/t1.jsonl" "$tmp/req.json")
        awk "BEGIN{print ($x - $y) / 99}" >>"$tmp/callcpu.$n"
      fi
      unset EPHEMERAL_STATE_DIR
    done
    a=${EPOCHREALTIME/[.,]/}000; "${BWRAP[@]}" sh -c "$loop"; m=${EPOCHREALTIME/[.,]/}000; "${BWRAP[@]}" sh -c 'sh -c true'; c=${EPOCHREALTIME/[.,]/}000
    echo "$(( (m - a) - (c - m) ))" | awk '{print $1/99/1e6}' >>"$tmp/call.bw"
    if [ $have_perf = 1 ]; then
      x=$(cpu "${BWRAP[@]}" sh -c "$loop"); y=$(cpu "${BWRAP[@]}" sh -c 'sh -c true')
      awk "BEGIN{print ($x - $y) / 99}" >>"$tmp/callcpu.bw"
    fi
  done
  row "a run's cost per shell call, ms ($R rounds; bwrap: a loop of \`sh -c true\`)" \
    "$tmp/call.old" "$tmp/call.new" "$tmp/call.bw"
  [ $have_perf = 1 ] && row "a run's CPU per shell call, ms" "$tmp/callcpu.old" "$tmp/callcpu.new" \
    "$tmp/callcpu.bw"

  echo "== 3. concurrent runs of the example (CLI processes, and ephemerald clients)"
  ex=$EPH_SRCDIR/examples/sandbox-proof
  python3 -c 'import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)["choices"][0]["message"]
    for c in m.get("tool_calls") or []:
        print(json.loads(c["function"]["arguments"])["command"])' "$ex/transcript.jsonl" >"$tmp/cmds"
  sed 's|^{|{"model": "replay:'"$ex"'/transcript.jsonl", |' "$ex/request.json" >"$tmp/req-d.json"
  # One daemon per build, on the tests' configuration (replayed model), each its own state.
  mkdir -p "$tmp/cfg"
  sed -e 's/^model_plugin = .*/model_plugin = "model-replay";/' -e '/^server: {/,/^};/d' "$EPH_CONF" \
    >"$tmp/cfg/ephemeral.conf"
  echo 'server: { max_concurrent_runs = 16; max_queued_runs = 256; };' >>"$tmp/cfg/ephemeral.conf"
  ln -sfn "$EPH_CONFD" "$tmp/cfg/conf.d"
  for n in old new; do
    b=${BUILD[$n]}
    e=(--config "$tmp/cfg/ephemeral.conf" --state-dir "$tmp/$n/dstate")
    "$b/ephemeral" "${e[@]}" keys create --org benchc --name benchc >"$tmp/$n/key" 2>/dev/null
    "$b/ephemeral" "${e[@]}" orgs credit benchc 1000000000 >/dev/null
    "$b/ephemerald" "${e[@]}" --listen 127.0.0.1:0 2>"$tmp/$n/dlog" &
    dpids+=($!)
    for _ in $(seq 200); do grep -q 'listening on' "$tmp/$n/dlog" && break; sleep 0.05; done
    sed -n 's/^ephemerald: listening on //p' "$tmp/$n/dlog" | tail -1 >"$tmp/$n/url"
  done
  # One warm client per build (bench/client.py: N kept-alive connections, as an SDK's pool),
  # told N on a FIFO, answering the N status codes: no client start-up inside the timed loop.
  declare -A URL KEY TO FROM
  for w in old new; do
    URL[$w]=$(cat "$tmp/$w/url")
    KEY[$w]=$(cat "$tmp/$w/key")
    mkfifo "$tmp/$w/cin" "$tmp/$w/cout"
    python3 "$EPH_SRCDIR/bench/client.py" "${URL[$w]}" "${KEY[$w]}" "$tmp/req-d.json" \
      <"$tmp/$w/cin" >"$tmp/$w/cout" &
    dpids+=($!)
    exec {fd}>"$tmp/$w/cin"
    TO[$w]=$fd
    exec {fd}<"$tmp/$w/cout"
    FROM[$w]=$fd
  done
  post() { # post OLD|NEW N: N runs through that build's daemon at once, waiting for their end
    local codes
    echo "$2" >&"${TO[$1]}"
    read -r codes <&"${FROM[$1]}"
    printf '%s\n' $codes >>"$tmp/$1/codes"
  }
  post old 1; post new 1 # warm: the first run loads the plugins it needs
  R=${CMP_RUN_ROUNDS:-5}
  for n in 1 4 16; do
    for k in $(seq "$R"); do
      for w in old new; do
        b=${BUILD[$w]}
        s=$(st "$w")
        a=${EPOCHREALTIME/[.,]/}000; pids=""
        for i in $(seq $n); do
          EPHEMERAL_STATE_DIR=$s "$b/ephemeral" run --quiet --replay "$ex/transcript.jsonl" \
            "$ex/request.json" >/dev/null 2>&1 &
          pids="$pids $!"
        done
        wait $pids
        c=${EPOCHREALTIME/[.,]/}000
        awk "BEGIN{printf \"%.2f\\n\", $n / (($c - $a) / 1e9)}" >>"$tmp/cli.$n.$w"
        a=${EPOCHREALTIME/[.,]/}000; post "$w" "$n"; c=${EPOCHREALTIME/[.,]/}000
        awk "BEGIN{printf \"%.2f\\n\", $n / (($c - $a) / 1e9)}" >>"$tmp/d.$n.$w"
      done
      a=${EPOCHREALTIME/[.,]/}000; pids=""
      for i in $(seq $n); do
        "${BWRAP[@]}" --ro-bind "$tmp/cmds" /tmp/cmds sh -c 'while IFS= read -r c; do sh -c "$c" >/dev/null 2>&1; done </tmp/cmds' &
        pids="$pids $!"
      done
      wait $pids
      c=${EPOCHREALTIME/[.,]/}000
      awk "BEGIN{printf \"%.2f\\n\", $n / (($c - $a) / 1e9)}" >>"$tmp/bw.$n"
    done
    row "concurrent runs of the example, N=$n \`ephemeral run\` processes, runs/s ($R rounds)" \
      "$tmp/cli.$n.old" "$tmp/cli.$n.new" "$tmp/bw.$n"
    row "the same through one ephemerald, N=$n connections of a warm client, runs/s" "$tmp/d.$n.old" "$tmp/d.$n.new" "$tmp/bw.$n"
  done
  for w in old new; do
    bad=$(grep -vc '^201$' "$tmp/$w/codes" || true)
    [ "$bad" = 0 ] || echo "  ($w ephemerald answered $bad POSTs with something else than 201)"
  done
fi

echo
echo "Interleaved (old, new, bwrap in turn); median (min-max); load average $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo "old: $OLD"
echo "new: $NEW"
echo
echo "| figure | old | new | bwrap | old / bwrap | new / bwrap |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
