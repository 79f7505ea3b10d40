# Sourced by the microVM tests: makes sure QEMU and a current guest image exist in the state
# directory the CLI will use, else prints a TAP skip and exits.
STATE=${EPHEMERAL_STATE_DIR:-${XDG_STATE_HOME:-${HOME:-/root}/.local/state}/ephemeral}
GUEST="$EPH_BUILDDIR/guest/ephemeral-guest"
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  echo "1..0 # SKIP qemu-system-x86_64 not installed (Debian package qemu-system-x86)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "1..0 # SKIP microVM tests run as root (QEMU drops to its own uid)"
  exit 0
fi
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
