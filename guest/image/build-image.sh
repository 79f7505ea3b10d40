#!/bin/sh
# Builds the microVM guest image from Debian packages only:
#   <state_dir>/guest-image/vmlinuz        the kernel of linux-image-cloud-amd64
#   <state_dir>/guest-image/initrd.cpio    the whole read-only root, as an uncompressed cpio
#   <state_dir>/guest-image/kernel-release the kernel's release (uname -r inside the guest)
#   <state_dir>/guest-image/image.sha256   digest of the three above (names the snapshots)
#
# usage: build-image.sh [--state-dir DIR] GUEST_BINARY
#   GUEST_BINARY  the static ephemeral-guest; it becomes PID 1 (exec'd by /init)
#   DIR           default: $EPH_STATE_DIR, else $EPHEMERAL_STATE_DIR (as ephemeral reads it), else ~/.local/state/ephemeral
#
# Why an uncompressed initramfs as the root: under TCG the kernel's decompressor is the
# slowest step of unpacking; a plain cpio is copied, not inflated, and needs no block driver,
# filesystem module or switch_root. /init remounts the root read-only before it hands over
# to the guest, so the worker's only writable place is the size-capped tmpfs the guest
# mounts on /tmp (size from eph_tmp_mib= on the kernel command line).
#
# Reproducible: the same packages and the same guest binary give the same bytes
# (SOURCE_DATE_EPOCH stamps every file, the cpio is written in sorted order with
# --reproducible, the bytecode is hash-based).
set -eu

state_dir=${EPH_STATE_DIR:-${EPHEMERAL_STATE_DIR:-${HOME:-/root}/.local/state/ephemeral}}
while [ $# -gt 0 ]; do
  case $1 in
    --state-dir) state_dir=$2; shift 2 ;;
    --state-dir=*) state_dir=${1#*=}; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
guest_bin=${1:?usage: build-image.sh [--state-dir DIR] GUEST_BINARY}
guest_bin=$(readlink -f "$guest_bin" 2>/dev/null || echo "$guest_bin")
[ -x "$guest_bin" ] || { echo "build-image.sh: $guest_bin: not an executable" >&2; exit 1; }
if ! file -b "$guest_bin" 2>/dev/null | grep -q 'statically linked' &&
   ldd "$guest_bin" >/dev/null 2>&1; then
  echo "build-image.sh: $guest_bin: must be statically linked (it runs before any library)" >&2
  exit 1
fi

# 2023-11-14: any fixed instant works; it only has to be the same on every build.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
export SOURCE_DATE_EPOCH LC_ALL=C TZ=UTC
start=$(date +%s.%N)

out=$state_dir/guest-image
cache=$state_dir/guest-image-cache   # downloaded .debs, reused by later builds
mkdir -p "$out" "$cache"
chmod 0755 "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/eph-image.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
root=$work/root

# ---- packages: downloaded once into the cache (apt-get download runs as root: no _apt
# sandbox user can write there, so say so rather than warn)
fetch() {
  ( cd "$cache" && apt-get -q -o APT::Sandbox::User=root download "$@" >/dev/null ) || {
    echo "build-image.sh: apt-get download $* failed (run apt-get update?)" >&2; exit 1; }
}
kpkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
[ -n "$kpkg" ] || { echo "build-image.sh: cannot resolve linux-image-cloud-amd64 (apt-get update?)" >&2; exit 1; }
ls "$cache/${kpkg}"_*.deb >/dev/null 2>&1 || fetch "$kpkg"
ls "$cache"/busybox-static_*.deb >/dev/null 2>&1 || fetch busybox-static
mkdir -p "$work/k" "$work/bb"
dpkg -x "$(ls "$cache/${kpkg}"_*.deb | tail -1)" "$work/k"
dpkg -x "$(ls "$cache"/busybox-static_*.deb | tail -1)" "$work/bb"
kver=$(ls "$work/k/lib/modules" | head -1)

# ---- skeleton (Debian's merged /usr)
mkdir -p "$root"
cd "$root"
mkdir -p usr/bin usr/sbin usr/lib/x86_64-linux-gnu usr/lib64 etc proc sys dev tmp run root \
  home/worker "lib/modules/$kver" 2>/dev/null || true
rm -rf lib
mkdir -p "usr/lib/modules/$kver"
ln -s usr/bin bin
ln -s usr/sbin sbin
ln -s usr/lib lib
ln -s usr/lib64 lib64
chmod 1777 tmp
chmod 0700 root

# ---- busybox: the shell and coreutils of the worker (python and curl come below)
cp "$work/bb/bin/busybox" usr/bin/busybox
for applet in $(usr/bin/busybox --list); do
  case $applet in busybox|init|linuxrc) continue ;; esac
  [ -e "usr/bin/$applet" ] || ln -s busybox "usr/bin/$applet"
done

# ---- python3 and curl from the host's Debian packages, with every shared library they need
need_pkg() {
  dpkg -s "$1" >/dev/null 2>&1 || {
    echo "build-image.sh: Debian package $1 is not installed (apt-get install $1)" >&2; exit 1; }
}
for p in python3.11-minimal libpython3.11-minimal libpython3.11-stdlib curl; do need_pkg "$p"; done
copy_file() { # copy_file HOSTPATH: same path inside the root, symlinks followed
  mkdir -p "$root$(dirname "$1")"
  cp -L "$1" "$root$1"
}
copy_libs() { # copy_libs ELF...: the ELF files and their shared libraries
  for elf in "$@"; do
    ldd "$elf" 2>/dev/null | awk '/=>/ { print $3 } /^\t\/.*ld-linux/ { print $1 }'
  done | sort -u | while read -r lib; do
    [ -n "$lib" ] && [ -f "$lib" ] || continue
    # the loader looks for the soname ldd printed; /lib is usr/lib in the root
    case $lib in /lib/*|/lib64/*) p=/usr$lib ;; *) p=$lib ;; esac
    [ -e "$root$p" ] || { mkdir -p "$root$(dirname "$p")"; cp -L "$lib" "$root$p"; }
  done
}
copy_file /usr/bin/python3.11
copy_file /usr/bin/curl
ln -s python3.11 usr/bin/python3
ln -s python3 usr/bin/python
# the stdlib, less the parts a worker's script has no use for in a sandbox without a display
dpkg -L python3.11-minimal libpython3.11-minimal libpython3.11-stdlib |
  grep '^/usr/lib/python3.11/' | grep -v -e __pycache__ -e '/config-3' -e '/idlelib' \
    -e '/tkinter' -e '/turtledemo' -e '/ensurepip' -e '/lib2to3' -e '/test/' |
  sort | while read -r f; do
    [ -f "$f" ] && [ ! -L "$f" ] && copy_file "$f"
  done
copy_libs /usr/bin/python3.11 /usr/bin/curl $(find usr/lib/python3.11/lib-dynload -name '*.so' | sed 's|^|/|')
# the loader where the ELF interpreter field points (/lib64 -> usr/lib64)
[ -e usr/lib64/ld-linux-x86-64.so.2 ] || cp -L /lib64/ld-linux-x86-64.so.2 usr/lib64/
# bytecode now, hash-based and unchecked: the root is read-only so Python could never cache it,
# and compiling the stdlib at every start would cost seconds under TCG
python3.11 -m compileall -q -j1 --invalidation-mode unchecked-hash -d /usr/lib/python3.11 \
  usr/lib/python3.11 >/dev/null

# ---- the kernel's virtio modules, in load order
mods="kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio_mmio.ko kernel/drivers/char/virtio_console.ko"
# the NIC of a run granting web (virtio_net needs net_failover, which needs failover: the
# cloud kernel's modules.dep); loaded by /init only when eph_net= is on the command line
netmods="kernel/net/core/failover.ko kernel/drivers/net/net_failover.ko
kernel/drivers/net/virtio_net.ko"
for m in $mods $netmods; do
  cp "$work/k/lib/modules/$kver/$m" "usr/lib/modules/$kver/"
done
cp "$work/k/boot/vmlinuz-$kver" "$work/vmlinuz"

# ---- users and name service: root and the worker; no resolver config, so name lookups fail
cat > etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
worker:x:1000:1000:worker:/home/worker:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat > etc/group <<'EOF'
root:x:0:
worker:x:1000:
nogroup:x:65534:
EOF
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' > etc/hosts
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > etc/nsswitch.conf
chown 1000:1000 home/worker
chmod 0755 home/worker

# ---- PID 1: /init loads the virtio modules, seals the root read-only and execs the guest
cp "$guest_bin" usr/sbin/ephemeral-guest
chmod 0755 usr/sbin/ephemeral-guest
{
  echo '#!/bin/busybox sh'
  echo '# Kernel parameters without a dot arrive here as environment: eph_tmp_mib (size of'
  echo '# the /tmp tmpfs the guest mounts),'
  echo '# eph_init (tests replace the guest with it). Module order matters: each needs the last.'
  echo 'export PATH=/usr/bin:/usr/sbin'
  for m in $mods; do echo "insmod /lib/modules/$kver/$(basename "$m")"; done
  echo '# eph_net=ADDR/32,PROXY: the run grants web; the guest gives eth0 ADDR and one route.'
  printf '[ -n "${eph_net:-}" ] && { %s; }\n' "$(for m in $netmods; do printf 'insmod /lib/modules/%s/%s && ' "$kver" "$(basename "$m")"; done; echo :)"
  echo '# busybox finds the mount to change in /proc/mounts; the guest mounts its own /proc'
  echo '# eph_pids: the worker'"'"'s process limit (RLIMIT_NPROC counts every process of uid 1000;'
  echo '# the guest, root, is exempt). min_free_kbytes: the console allocates atomically, and a'
  echo '# guest out of memory would drop frames instead of sending them.'
  echo '[ -n "${eph_pids:-}" ] && ulimit -u "$eph_pids"'
  echo 'mount -t proc proc /proc && echo 8192 > /proc/sys/vm/min_free_kbytes &&'
  echo '  mount -o remount,ro / && umount /proc ||'
  echo '  { echo "init: cannot make / read-only" >&2; exit 1; }'
  echo 'exec ${eph_init:-/usr/sbin/ephemeral-guest} --vm --device /dev/vport0p1 ${eph_tmp_mib:+--tmp-size-mib $eph_tmp_mib} ${eph_net:+--net $eph_net}'
} > init
chmod 0755 init

# ---- fixed metadata, then the cpio in sorted order
find . -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
find . -not -path './home/worker*' -exec chown -h 0:0 {} +
find . -print | sed 's|^\./||; /^\.$/d' | sort |
  cpio --quiet -o -H newc --reproducible > "$work/initrd.cpio"

# Two builds at once (two test runs, two checkouts) share $out: each builds in its own
# $work and installs under this lock, so neither renames the other's half-installed files.
exec 9>"$out/.install.lock"
flock 9
install -m 0644 "$work/vmlinuz" "$out/vmlinuz.new"
install -m 0644 "$work/initrd.cpio" "$out/initrd.cpio.new"
mv -f "$out/vmlinuz.new" "$out/vmlinuz"
mv -f "$out/initrd.cpio.new" "$out/initrd.cpio"
echo "$kver" > "$out/kernel-release"
sha256sum < "$guest_bin" | cut -d' ' -f1 > "$out/guest.sha256"  # lets tests spot a stale image
( cd "$out" && sha256sum vmlinuz initrd.cpio kernel-release > image.sha256 )
# snapshots of an older image are stale now
rm -rf "$state_dir/qemu/snapshots"
exec 9>&-

end=$(date +%s.%N)
ksize=$(stat -c %s "$out/vmlinuz")
isize=$(stat -c %s "$out/initrd.cpio")
echo "guest image: $out (kernel $kver)"
echo "  vmlinuz      $ksize bytes"
echo "  initrd.cpio  $isize bytes"
echo "  total        $((ksize + isize)) bytes"
awk -v a="$start" -v b="$end" 'BEGIN { printf "  built in     %.1f s\n", b - a }'
echo "  sha256       $(sha256sum "$out/image.sha256" | cut -c1-16)"
