#!/usr/bin/env bash
# Builds the sidecar image (default tag stage:dev) from binaries built on
# this machine. `make image` runs `make build` first, then this script.
#
# The Dockerfile starts FROM debian:bookworm-slim. When the Docker engine
# has no such image (a machine that can reach no container registry), this
# script makes one: debootstrap --variant=minbase of bookworm from this
# machine's Debian mirror, trimmed of docs and apt lists, imported with
# `docker import`. The rootfs tarball is cached, so a later run after
# `docker rmi` only imports it again.
#
# Environment:
#   STAGE_IMAGE          tag to build                  (default stage:dev)
#   STAGE_DEBIAN_MIRROR  mirror for debootstrap        (default: from /etc/apt)
#   STAGE_IMAGE_CACHE    where the rootfs tarball goes (default
#                        ${XDG_CACHE_HOME:-$HOME/.cache}/stage-image)
#   DOCKER, GO           the docker and go commands    (default docker, go)
set -euo pipefail
cd "$(dirname "$0")/.."

image=${STAGE_IMAGE:-stage:dev}
base=debian:bookworm-slim
suite=bookworm
docker=${DOCKER:-docker}
go=${GO:-go}
cache=${STAGE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stage-image}

say() { printf 'image: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# --- Docker must be there and answering.
if ! command -v "$docker" >/dev/null 2>&1; then
  die "'$docker' is not installed: install Docker Engine (Debian: apt-get install docker.io) or set DOCKER"
fi
if ! err=$("$docker" info --format '{{.ServerVersion}}' 2>&1 >/dev/null); then
  die "cannot reach the Docker daemon ($err); start it (systemctl start docker) or check DOCKER_HOST and your access to its socket"
fi

# --- Binaries: staged and stagectl come from `make build`; the synthetic
# engine is built here. All three are cgo binaries linked against this
# machine's glibc, which the bookworm base must not be older than.
for b in staged stagectl; do
  [ -x "bin/$b" ] || die "bin/$b is missing: run 'make build' (or 'make image', which does)"
done
say "building bin/stage-kvengine"
"$go" build -o bin/stage-kvengine ./deploy/kvengine
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

# --- The base image.
if "$docker" image inspect "$base" >/dev/null 2>&1; then
  say "$base is present; not rebuilding it"
else
  arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
  tarball=$cache/$suite-minbase-$arch.tar
  if [ ! -s "$tarball" ]; then
    [ "$(id -u)" = 0 ] || die "making $base with debootstrap needs root (or pull $base from a registry)"
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
    tar --numeric-owner --xattrs -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    cleanup
    trap - EXIT
    say "rootfs cached as $tarball ($(du -h "$tarball" | cut -f1), $((SECONDS - t0))s)"
  else
    say "using cached rootfs $tarball"
  fi
  say "docker import $tarball as $base"
  "$docker" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase $suite, made by stage scripts/image.sh" \
    "$tarball" "$base" >/dev/null
fi

# --- The sidecar image.
say "docker build -t $image"
old=$("$docker" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
"$docker" build -t "$image" .
new=$("$docker" image inspect --format '{{.Id}}' "$image")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  # The previous build of this tag is now untagged: drop it (kept when a
  # container still uses it or another tag names it).
  "$docker" rmi "$old" >/dev/null 2>&1 || true
fi
say "built $image: $("$docker" image inspect --format '{{.Id}} {{.Size}}' "$image" | awk '{printf "%s, %.0f MB", substr($1, 8, 12), $2 / 1e6}')"
