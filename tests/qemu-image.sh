# Sourced by the microVM tests: makes sure QEMU and a current guest image exist in the state
# directory the CLI will use, else prints a TAP skip and exits.
# The tests' state directory (tests/tap.sh's default, which the test sources after this
# file): the build tree's, never the user's own ~/.local/state/ephemeral.
export EPHEMERAL_STATE_DIR=${EPHEMERAL_STATE_DIR:-$EPH_BUILDDIR/tests/state}
STATE=$EPHEMERAL_STATE_DIR
GUEST="$EPH_BUILDDIR/guest/ephemeral-guest"
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  echo "1..0 # SKIP qemu-system-x86_64 not installed (Debian package qemu-system-x86)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "1..0 # SKIP microVM tests run as root (QEMU drops to its own uid)"
  exit 0
fi
# One test checks and builds at a time (make -j starts several microVM tests at once on a
# fresh state directory): the others wait here and find the image current, rather than
# build it again and remove the snapshots a running test boots from.
mkdir -p "$STATE"
exec 8>"$STATE/.test-image.lock"
flock 8
want=$(sha256sum < "$GUEST" 2>/dev/null | cut -d' ' -f1)
have=$(cat "$STATE/guest-image/guest.sha256" 2>/dev/null)
if [ ! -s "$STATE/guest-image/initrd.cpio" ] || [ "$want" != "$have" ]; then
  if ! sh "$EPH_SRCDIR/guest/image/build-image.sh" --state-dir "$STATE" "$GUEST" \
       > "${TMPDIR:-/tmp}/eph-image-build.$$.log" 2>&1; then
    echo "1..0 # SKIP the guest image cannot be built: $(tail -1 "${TMPDIR:-/tmp}/eph-image-build.$$.log")"
    rm -f "${TMPDIR:-/tmp}/eph-image-build.$$.log"
    exit 0
  fi
  rm -f "${TMPDIR:-/tmp}/eph-image-build.$$.log"
fi
exec 8>&-
