#!/bin/sh
# gen-conf5.sh EPHEMERAL PLUGIN_DIR TEMPLATE VERSION [CONF5_KEYS] > ephemeral.conf.5
#
# Writes ephemeral.conf(5) from the key tables themselves: `ephemeral config keys` prints
# every key of the core (eph_core_config_keys, rows in core/conf_core.h; nested keys as
# GROUP.KEY) and of every plugin's descriptor, the same tables the loader checks conf files
# against, with each key's type, default, unit and range (the range column carries the unit). Every plugin in PLUGIN_DIR is enabled for the
# occasion, so a plugin the shipped conf.d leaves disabled is documented too. A plugin that
# fails to load fails the generation (its keys would silently be missing). With CONF5_KEYS
# (docs/man/conf5-keys) the plugins' tables are read from their descriptors without init(),
# so a plugin that needs a server to start (ledger-postgres) is documented too; one that is
# not a loadable plugin still fails the generation.
set -eu
eph=$1 plugindir=$2 template=$3 version=$4 keystool=${5:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/eph-conf5.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/conf.d" "$tmp/state"
: >"$tmp/ephemeral.conf"
if [ -z "$keystool" ]; then
for so in "$plugindir"/*.so; do
  [ -e "$so" ] || continue
  name=$(basename "$so" .so)
  printf '%s: { enabled = true; };\n' "$name" >"$tmp/conf.d/$name.conf"
done
fi
run() { EPHEMERAL_STATE_DIR=$tmp/state "$eph" --config "$tmp/ephemeral.conf" --plugin-dir "$plugindir" "$@"; }
if [ -z "$keystool" ] && ! run config check >"$tmp/check.out" 2>&1; then
  echo "gen-conf5.sh: a plugin in $plugindir does not load:" >&2
  cat "$tmp/check.out" >&2
  exit 1
fi
run config keys >"$tmp/keys.tsv"
if [ -n "$keystool" ]; then
  set -- "$plugindir"/*.so
  [ -e "$1" ] && "$keystool" "$@" >>"$tmp/keys.tsv"
fi
[ -s "$tmp/keys.tsv" ] || { echo "gen-conf5.sh: no keys printed" >&2; exit 1; }

# troff-safe text: backslashes doubled as \e, a leading . or ' guarded by \&.
awk -F '\t' -v version="$version" -v keys="$tmp/keys.tsv" '
function esc(s) { gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s); if (s ~ /^[.\x27]/) s = "\\&" s; return s }
function section(b) {
  if (b == "ephemeral.conf")
    return ".SS ephemeral.conf (top level)\nThe core'"'"'s own settings, at the top level of ephemeral.conf."
  return ".SS " esc(b) "\nKeys of the block \\fB" esc(b) ": { enabled = true; ... };\\fR in conf.d."
}
/^@KEYS@$/ {
  prev = ""
  while ((getline line < keys) > 0) {
    n = split(line, f, "\t")
    if (f[1] != prev) { print section(f[1]); prev = f[1] }
    print ".TP"
    print ".B " esc(f[2])
    what = f[3] ", default " f[4]
    if (f[7] != "") what = what ", range " f[7]
    else if (f[5] != "") what = what ", unit: " f[5]
    print "(" esc(what) ")"
    print esc(f[6])
  }
  next
}
{ gsub(/@VERSION@/, version); print }
' "$template"
