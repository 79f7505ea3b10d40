# Tiny TAP helpers for the shell integration tests (sourced).
#   plan N; ok "description" command...; skip "reason" "description"; finish
# Tests print TAP on stdout; diagnostics go to stdout prefixed with '#'.
set -u
EPH_BUILDDIR=${EPH_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
EPH_SRCDIR=${EPH_SRCDIR:-$EPH_BUILDDIR}
EPHEMERAL="$EPH_BUILDDIR/ephemeral"

# The configuration every test starts from: the tree's ephemeral.conf and conf.d, except that
# the jail keeps its slot records, cgroups and host uids apart from a real installation's
# (/run/ephemeral/jail, cgroup parent "ephemeral", uid_base 100000): a test never touches
# the sandboxes of a daemon running on the same host, nor its sweep the tests'; a daemon
# started without --listen takes a free port, never 8080. Generated
# once per build tree (atomically: tests start in parallel), again when a source is newer.
# Tests copy $EPH_CONF and $EPH_CONFD/*.conf to change keys; EPHEMERAL_CONFIG makes it the
# default of every CLI and daemon they start without --config.
EPH_JAIL_RUN_DIR=/run/ephemeral-test/jail
EPH_JAIL_CGROUP_PARENT=ephemeral-test
EPH_TESTCONF_DIR="$EPH_BUILDDIR/tests/etc"
EPH_CONF="$EPH_TESTCONF_DIR/ephemeral.conf"
EPH_CONFD="$EPH_TESTCONF_DIR/conf.d"
# eph_private_jail_conf FILE: rewrites a backend-jail conf file (the tree's, or an installed
# copy a test runs) to the tests' run_dir, cgroup parent and uid range; fails if a key is
# missing, so a test never falls back to a real installation's.
eph_private_jail_conf() {
  sed -i -e "s|^  run_dir = .*;|  run_dir = \"$EPH_JAIL_RUN_DIR\";|" \
    -e "s|^  cgroup_parent = .*;|  cgroup_parent = \"$EPH_JAIL_CGROUP_PARENT\";|" \
    -e 's|^  uid_base = .*;|  uid_base = 1000000000;|' "$1" &&
    grep -q "run_dir = \"$EPH_JAIL_RUN_DIR\"" "$1" &&
    grep -q "cgroup_parent = \"$EPH_JAIL_CGROUP_PARENT\"" "$1" &&
    grep -q 'uid_base = 1000000000;' "$1"
}
_tap_testconf() {
  local newer
  newer=$(find "$EPH_SRCDIR/ephemeral.conf" "$EPH_SRCDIR/conf.d" "$EPH_SRCDIR/tests/tap.sh" -newer "$EPH_CONF" 2>/dev/null | head -n1)
  [ -f "$EPH_CONF" ] && [ -z "$newer" ] && return 0
  local t
  t=$(mktemp -d "$EPH_BUILDDIR/tests/.etc.XXXXXX") || return 1
  mkdir "$t/conf.d" && cp "$EPH_SRCDIR/ephemeral.conf" "$t/" &&
    cp "$EPH_SRCDIR"/conf.d/*.conf "$t/conf.d/" &&
    eph_private_jail_conf "$t/conf.d/10-backend-jail.conf" &&
    sed -i 's|^\(  listen = \)"127.0.0.1:8080";|\1"127.0.0.1:0";|' "$t/ephemeral.conf" &&
    ! grep -q 8080 "$t/ephemeral.conf" || {
    echo "Bail out! cannot make the test configuration in $t"; rm -rf "$t"; exit 1; }
  # Replace as a whole: a directory rename is atomic, a concurrent reader sees old or new.
  local old="$EPH_BUILDDIR/tests/.etc-old.$$"
  [ -d "$EPH_TESTCONF_DIR" ] && mv "$EPH_TESTCONF_DIR" "$old" 2>/dev/null
  mv -T "$t" "$EPH_TESTCONF_DIR" 2>/dev/null || rm -rf "$t"
  rm -rf "$old"
}
# EPH_TAP_NO_TESTCONF: a test that runs installed binaries only, somewhere the source tree
# is not visible (deb.test inside its private copy of the machine, whose /tmp is empty).
if [ -z "${EPH_TAP_NO_TESTCONF:-}" ]; then
  mkdir -p "$EPH_BUILDDIR/tests"
  _tap_testconf
  export EPHEMERAL_CONFIG="$EPH_CONF"
  # A test that names no state directory of its own (the microVM tests share one, with its
  # guest image and snapshots) uses the build tree's, never the CLI's default for the user
  # running the suite (~/.local/state/ephemeral: that user's own runs and ledger).
  # tests/qemu-image.sh, sourced before this file by the microVM tests, says the same.
  export EPHEMERAL_STATE_DIR=${EPHEMERAL_STATE_DIR:-$EPH_BUILDDIR/tests/state}
fi
_tap_n=0
_tap_failed=0

plan() { echo "1..$1"; }

# ok DESCRIPTION CMD...: passes when CMD exits 0; on failure prints CMD's output as diagnostics.
ok() {
  local desc=$1; shift
  _tap_n=$((_tap_n + 1))
  local out
  if out=$("$@" 2>&1); then
    echo "ok $_tap_n - $desc"
  else
    echo "not ok $_tap_n - $desc"
    printf '%s\n' "$out" | sed 's/^/#   /' | head -n 40
    _tap_failed=$((_tap_failed + 1))
  fi
}

# check DESCRIPTION: records the status of the last command ($?) as a test, and returns it.
check() {
  local status=$? desc=$1
  _tap_n=$((_tap_n + 1))
  if [ "$status" -eq 0 ]; then echo "ok $_tap_n - $desc"; else
    echo "not ok $_tap_n - $desc"; _tap_failed=$((_tap_failed + 1)); fi
  # Returned so `check "..." || diag ...` prints its diagnostics on a failure.
  return "$status"
}

skip() { _tap_n=$((_tap_n + 1)); echo "ok $_tap_n - $2 # SKIP $1"; }

diag() { printf '%s\n' "$*" | sed 's/^/# /'; }

finish() { [ "$_tap_failed" -eq 0 ]; exit $?; }

# contains FILE PATTERN: grep -q with the file shown on failure.
contains() { grep -qE -- "$2" "$1" || { echo "--- $1 lacks /$2/:"; cat "$1"; return 1; }; }
