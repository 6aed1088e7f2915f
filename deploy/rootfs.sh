#!/usr/bin/env bash
# Gathers the root filesystem of the aura-gateway image:
#
#   deploy/rootfs.sh BINARY OUTDIR      -> OUTDIR/rootfs/
#
#   usr/local/bin/aura-gateway          the binary (0755)
#   <the paths ldd prints>              every shared library it loads, and the ELF loader
#   etc/passwd, etc/group               root and the unprivileged user aura (65532:65532)
#   etc/nsswitch.conf                   files before DNS for hosts, passwd and group
#   etc/ssl/certs/ca-certificates.crt   CA bundle for outgoing TLS (CA_BUNDLE=FILE to pick another)
#   tmp/                                empty, mode 1777
#
# There is one layout: the Dockerfile's build stage runs this script (`deploy/rootfs.sh
# target/production/aura-gateway /` -> /rootfs), and deploy/Containerfile.prebuilt copies the
# OUTDIR/rootfs/ made by it outside a container (from a binary built on the host, which must
# then be built against the same or an older glibc than the libraries gathered with it; here
# they are the host's own). Both images are `FROM scratch` with that tree and nothing else.
set -euo pipefail

usage() {
  echo "usage: $0 BINARY OUTDIR   (writes OUTDIR/rootfs)" >&2
  exit 2
}
[ "$#" -eq 2 ] || usage
binary=$1
outdir=$2
if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then
  echo "$0: $binary: not an executable file" >&2
  exit 1
fi
ca_bundle=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca_bundle" ] || {
  echo "$0: no CA bundle at $ca_bundle (install ca-certificates, or set CA_BUNDLE=FILE)" >&2
  exit 1
}
command -v ldd >/dev/null || { echo "$0: ldd not found (package libc-bin)" >&2; exit 1; }

root=${outdir%/}/rootfs
rm -rf -- "$root"
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"

install -m 0755 "$binary" "$root/usr/local/bin/aura-gateway"

# Shared libraries, at the paths the loader found them (ldd), so that the loader finds them at
# the same place in the image without an ld.so.cache. `cp -L`: the files, not their symlinks.
# A static binary has none (ldd says "not a dynamic executable" and fails).
libs=()
if ldd_out=$(ldd "$binary" 2>&1); then
  if grep -q 'not found' <<<"$ldd_out"; then
    echo "$0: missing libraries:" >&2
    grep 'not found' <<<"$ldd_out" >&2
    exit 1
  fi
  while read -r line; do
    case $line in
      *"=> /"*) path=${line#*=> }; path=${path%% (*} ;;  # libc.so.6 => /lib/.../libc.so.6 (0x…)
      /*) path=${line%% (*} ;;                         # /lib64/ld-linux-x86-64.so.2 (0x…)
      *) continue ;;                                   # linux-vdso.so.1 (0x…): in the kernel
    esac
    libs+=("$path")
  done <<<"$ldd_out"
elif ! grep -qE 'not a dynamic executable|statically linked' <<<"$ldd_out"; then
  echo "$0: ldd $binary failed: $ldd_out" >&2
  exit 1
fi
for lib in "${libs[@]}"; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
  chmod 0755 "$root$lib"
done

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
aura:x:65532:65532:aura:/nonexistent:/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
aura:x:65532:
EOF
# Without this file glibc asks DNS before /etc/hosts; the name services built into libc.so.6
# (files, dns) are the only ones there are in the image.
cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
cp -L "$ca_bundle" "$root/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf" \
  "$root/etc/ssl/certs/ca-certificates.crt"
chmod 1777 "$root/tmp"
find "$root" -type d ! -path "$root/tmp" -exec chmod 0755 {} +

echo "rootfs: $root ($(du -sh "$root" | cut -f1))"
(cd "$root" && find . ! -type d | sort | sed 's|^\.|  |')
