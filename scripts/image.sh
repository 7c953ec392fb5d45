#!/usr/bin/env bash
# Builds the sidecar image (default stage:dev) from binaries built on this
# machine, with no container engine: `make image` runs `make build`, then
# this script, which
#
#   1. makes the base root filesystem, once: debootstrap --variant=minbase of
#      Debian bookworm from this machine's Debian mirror, trimmed of docs and
#      apt lists, kept as a tarball in the cache (no registry is contacted);
#   2. builds bin/stage-kvengine (the synthetic engine) and the image
#      builder, deploy/image (go-containerregistry);
#   3. writes the image: STAGE_IMAGE_OUT/oci, an OCI image layout, and
#      STAGE_IMAGE_OUT/docker-archive.tar (deploy/README.md says how to
#      push or load them).
#
# Environment:
#   STAGE_IMAGE          name and tag                  (default stage:dev)
#   STAGE_IMAGE_OUT      where the image goes          (default bin/image)
#   STAGE_DEBIAN_MIRROR  mirror for debootstrap        (default: from /etc/apt)
#   STAGE_IMAGE_CACHE    where the rootfs tarball goes (default
#                        ${XDG_CACHE_HOME:-$HOME/.cache}/stage-image)
#   GO                   the go command                (default go)
set -euo pipefail
cd "$(dirname "$0")/.."

image=${STAGE_IMAGE:-stage:dev}
out=${STAGE_IMAGE_OUT:-bin/image}
suite=bookworm
go=${GO:-go}
cache=${STAGE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stage-image}

say() { printf 'image: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# --- Binaries: staged and stagectl come from `make build`; the synthetic
# engine is built here. All three are cgo binaries linked against this
# machine's glibc, which the bookworm base must not be older than.
for b in staged stagectl; do
  [ -x "bin/$b" ] || die "bin/$b is missing: run 'make build' (or 'make image', which does)"
done
say "building bin/stage-kvengine and bin/stage-image"
"$go" build -o bin/stage-kvengine ./deploy/kvengine
(cd deploy/image && "$go" build -o ../../bin/stage-image .) || die "building the image builder (deploy/image) failed"
host_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
case "$host_glibc" in
  ""|2.3[0-6]|2.[12][0-9]) ;; # bookworm ships glibc 2.36
  *) say "warning: binaries built against glibc $host_glibc; bookworm has 2.36 and they may not start there" ;;
esac

# debian_mirror prints the first Debian mirror that serves $suite, from
# deb822 .sources files, then one-line .list files.
debian_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    # One stanza per paragraph: print its first URI when Types has deb and
    # Suites has exactly $suite.
    awk -v suite="$suite" '
      function flush() { if (deb && hasSuite && uri != "") { print uri; found = 1; exit } deb = 0; hasSuite = 0; uri = "" }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) hasSuite = 1 }
      tolower($1) == "uris:" { uri = $2 }
      END { if (!found) flush() }
    ' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    # deb [options] URI SUITE COMPONENTS...
    awk -v suite="$suite" '
      $1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                    if ($(i+1) == suite) { print $i; exit } }
    ' "$f"
  done
}

# --- The base root filesystem.
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
tarball=$cache/$suite-minbase-$arch.tar
if [ ! -s "$tarball" ]; then
  [ "$(id -u)" = 0 ] || die "making the base root filesystem with debootstrap needs root (or put a $suite rootfs tarball at $tarball)"
  if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } ||
      die "could not install debootstrap with apt-get"
  fi
  mirror=${STAGE_DEBIAN_MIRROR:-$(debian_mirror | head -n1)}
  mirror=${mirror:-http://deb.debian.org/debian}
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  cleanup() {
    # debootstrap mounts proc and sys in the chroot; never delete through a mount.
    awk -v r="$root" 'index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done
    rm -rf --one-file-system "$root" "$tarball.tmp"
  }
  trap cleanup EXIT
  say "debootstrap --variant=minbase $suite from $mirror ($arch)"
  t0=$SECONDS
  debootstrap --variant=minbase --arch="$arch" "$suite" "$root" "$mirror" > "$cache/debootstrap.log" 2>&1 ||
    die "debootstrap failed; see $cache/debootstrap.log"
  # Slim it: no package lists, caches, docs, man pages or translations,
  # and keep dpkg from installing them again in derived images.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
         "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
         "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/usr/share/lintian/*
  cat > "$root/etc/dpkg/dpkg.cfg.d/stage-slim" <<'EOF'
# Made by stage's scripts/image.sh: leave documentation out of this image.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  # An image carries no machine id (every container of it would claim the
  # same one); staged then tells nodes apart by the kernel's boot id.
  rm -f "$root/etc/machine-id" "$root/var/lib/dbus/machine-id"
  printf 'deb %s %s main\n' "$mirror" "$suite" > "$root/etc/apt/sources.list"
  # /dev, /proc and /sys are the runtime's (it mounts its own): the layer
  # carries the empty directories, not device nodes or what is mounted there.
  tar --numeric-owner --xattrs --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
      -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  cleanup
  trap - EXIT
  say "rootfs cached as $tarball ($(du -h "$tarball" | cut -f1), $((SECONDS - t0))s)"
else
  say "using the cached rootfs $tarball"
fi

# --- The sidecar image. The commit's time is the image's: the same commit
# and base give the same stage layer.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
rev=$(git rev-parse HEAD 2>/dev/null || true)
say "assembling $image in $out"
bin/stage-image --base "$tarball" --bin bin --config deploy/docker/staged.yaml --tag "$image" \
  --out "$out" --revision "$rev" >/dev/null || die "assembling the image failed"
say "built $image: $out/oci (OCI layout, tag ${image##*:}) and $out/docker-archive.tar ($(du -sh "$out/oci" | cut -f1))"
