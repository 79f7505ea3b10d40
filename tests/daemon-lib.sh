# Helpers for the ephemerald tests (sourced after tap.sh): a test ephemeral.conf beside a
# symlinked conf.d with every model call replayed (model_plugin = "model-replay"), a
# temporary state directory, the daemon on a free loopback port.
#   daemon_config DIR 'server: { ... };'   -> sets CFG, STATE
#   daemon_start [ARGS...]                 -> sets DPID, URL (waits until it listens)
#   daemon_stop                            -> SIGTERM, waits; returns its exit status
#   eph ARGS...                            -> the CLI on the same config and state
#   sq DB SQL                              -> one value from a SQLite file of the state
EPHEMERALD="$EPH_BUILDDIR/ephemerald"
DPID=
URL=

daemon_config() {
  local dir=$1 server=${2:-}
  mkdir -p "$dir/cfg"
  sed -e 's/^model_plugin = .*/model_plugin = "model-replay";/' -e '/^server: {/,/^};/d' \
    "$EPH_CONF" >"$dir/cfg/ephemeral.conf"
  printf '%s\n' "$server" >>"$dir/cfg/ephemeral.conf"
  ln -sfn "$EPH_CONFD" "$dir/cfg/conf.d"
  CFG=$dir/cfg/ephemeral.conf
  STATE=$dir/state
  DLOG=$dir/daemon.log
}

daemon_start() {
  : >"$DLOG"
  "$EPHEMERALD" --config "$CFG" --state-dir "$STATE" --listen "${LISTEN:-127.0.0.1:0}" "$@" \
    2>>"$DLOG" &
  DPID=$!
  URL=
  for _ in $(seq 200); do
    URL=$(sed -n 's/^ephemerald: listening on //p' "$DLOG" | tail -n1)
    [ -n "$URL" ] && return 0
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.05
  done
  echo "# ephemerald did not start:"; sed 's/^/#   /' "$DLOG"
  return 1
}

daemon_stop() {
  [ -n "$DPID" ] || return 0
  kill -TERM "$DPID" 2>/dev/null
  local status=0
  wait "$DPID" || status=$?
  DPID=
  return $status
}

eph() { "$EPHEMERAL" --config "$CFG" --state-dir "$STATE" "$@"; }

sq() { sqlite3 -batch -noheader "$STATE/$1" "$2"; }

# new_key ORG NAME: creates an API key and prints it.
new_key() { eph keys create --org "$1" --name "$2" 2>/dev/null; }
