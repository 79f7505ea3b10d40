# Tiny TAP helpers for the shell integration tests (sourced).
#   plan N; ok "description" command...; skip "reason" "description"; finish
# Tests print TAP on stdout; diagnostics go to stdout prefixed with '#'.
set -u
EPH_BUILDDIR=${EPH_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
EPH_SRCDIR=${EPH_SRCDIR:-$EPH_BUILDDIR}
EPHEMERAL="$EPH_BUILDDIR/ephemeral"
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
