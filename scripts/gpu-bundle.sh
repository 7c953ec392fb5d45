# shellcheck shell=bash
# Shared by the scripts that carry files to the GPU machine in parts
# (gpu-peers-wheels.sh / gpu-peers.sh, gpu-vllm-wheels.sh / gpu-vllm.sh):
# a device call carries at most 64 MiB (the working tree included), and a
# carried folder is gone on the next call, so a bundle travels as one tar cut
# into parts, one git-ignored carry folder each (PREFIX1, PREFIX2, ...: e.g.
# .pw1 or .vw1), each part copied to a stash under /tmp on its call, which
# stays while the machine is held. Sourced, not run.
#
# Here:   bundle_pack DIR CACHE PREFIX PARTS TOOL   (DIR holds the files; PARTS
#         a number, or "auto": as few parts of at most BUNDLE_PART_MAX bytes as
#         hold it)
# There:  bundle_stash ROOT PREFIX STASH            (copies carried parts to STASH)
#         bundle_unpack ROOT PREFIX STASH WORK      (reassembles into WORK/bundle;
#         sets BSHA and BUNDLE_WHY, empty when it worked; needs a `log` function)

# Largest part: 64 MiB a call, less the working tree (a few MiB) and the manifest.
BUNDLE_PART_MAX=${BUNDLE_PART_MAX:-$((58 << 20))}

bundle_die() { echo "$BUNDLE_TOOL: $*" >&2; exit 1; }

bundle_pack() {
  local dir=$1 cache=$2 prefix=$3 parts=$4 k f sz tot tree flag
  BUNDLE_TOOL=$5
  (cd "$dir" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum >"$cache/SHA256SUMS") || bundle_die "sha256sum failed"
  mv "$cache/SHA256SUMS" "$dir/" || bundle_die "cannot move SHA256SUMS"
  tar -cf "$cache/bundle.tar" -C "$dir" . || bundle_die "tar failed"
  sz=$(stat -c %s "$cache/bundle.tar")
  [ "$parts" = auto ] && parts=$(((sz + BUNDLE_PART_MAX - 1) / BUNDLE_PART_MAX))
  case $parts in [1-9]) ;; *) bundle_die "the bundle needs $parts parts; 1 to 9 are possible" ;; esac
  rm -f "$cache"/bundle.tar.[0-9]*
  split -n "$parts" -d -a 1 "$cache/bundle.tar" "$cache/bundle.tar." || bundle_die "split failed"
  local commit man=$cache/MANIFEST
  commit=$(git describe --always --dirty 2>/dev/null || echo unknown)
  {
    echo "# scripts/$BUNDLE_TOOL, $(date -u +%FT%TZ), tree $commit"
    echo "bundle $(sha256sum <"$cache/bundle.tar" | cut -d' ' -f1) $sz $parts"
    for k in $(seq 0 $((parts - 1))); do
      f=$cache/bundle.tar.$k
      echo "part $((k + 1)) $(sha256sum <"$f" | cut -d' ' -f1) $(stat -c %s "$f")"
    done
    sed 's/^/file /' "$dir/SHA256SUMS"
  } >"$man"
  rm -rf "$prefix"[0-9]
  for k in $(seq 1 "$parts"); do
    mkdir "$prefix$k" || bundle_die "cannot make $prefix$k"
    mv "$cache/bundle.tar.$((k - 1))" "$prefix$k/bundle.tar.$k" || bundle_die "cannot fill $prefix$k"
    cp "$man" "$prefix$k/MANIFEST" || bundle_die "cannot fill $prefix$k"
  done
  # the folders must stay out of git (and so out of every call's tree)
  local excl
  excl=$(git rev-parse --git-common-dir 2>/dev/null)/info/exclude
  for k in $(seq 1 "$parts"); do
    if ! git check-ignore -q "$prefix$k" 2>/dev/null; then
      mkdir -p "$(dirname "$excl")" && echo "/$prefix$k/" >>"$excl" && echo "$BUNDLE_TOOL: added /$prefix$k/ to $excl" >&2
    fi
  done
  # what each call will carry
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  echo "$BUNDLE_TOOL: bundle $sz bytes in $parts parts, tree $commit; the working tree that travels: $tree bytes" >&2
  for k in $(seq 1 "$parts"); do
    sz=$(du -sb "$prefix$k" | cut -f1)
    tot=$((sz + tree))
    flag=""; [ "$tot" -gt $((63 << 20)) ] && flag="  OVER 63 MiB with the tree: make the bundle smaller or use more parts"
    awk -v p="$prefix" -v k="$k" -v s="$sz" -v t="$tot" -v f="$flag" -v tool="$BUNDLE_TOOL" \
      'BEGIN { printf "%s: %s%d: %d bytes (%.1f MiB), with the tree %.1f MiB%s\n", tool, p, k, s, s / 1048576, t / 1048576, f }' >&2
  done
}

# bundle_partdir ROOT PREFIX STASH K: where part K is, carried on this call or stashed by an earlier one.
bundle_partdir() { if [ -d "$1/$2$4" ]; then echo "$1/$2$4"; else echo "$3/$2$4"; fi; }

bundle_stash() {
  local root=$1 prefix=$2 stash=$3 only=${4:-} d man k sha size f n=0
  mkdir -p "$stash" || return 1
  for d in "$root/$prefix"[0-9]; do
    [ -d "$d" ] || continue
    [ -n "$only" ] && [ "$d" != "$root/$prefix$only" ] && continue
    rm -rf "${stash:?}/${d##*/}" && cp -rL "$d" "$stash/" || return 1
    n=$((n + 1))
    man=$d/MANIFEST; k=${d##*"$prefix"}
    read -r _ _ sha size < <(grep "^part $k " "$man")
    f=$stash/$prefix$k/bundle.tar.$k
    if [ "$(stat -c %s "$f")" != "$size" ] || [ "$(sha256sum <"$f" | cut -d' ' -f1)" != "$sha" ]; then
      echo "stash: $prefix$k differs from its MANIFEST (size or sha256): carry it again" >&2; return 1
    fi
    echo "stash: $prefix$k checked ($size bytes) in $stash"
  done
  [ "$n" -gt 0 ] || { echo "stash: no $prefix${only:-N} was carried on this call" >&2; return 1; }
  ls -l "$stash"
}

# shellcheck disable=SC2034 # BUNDLE_WHY and BSHA are read by the sourcing script
bundle_unpack() {
  local root=$1 prefix=$2 stash=$3 work=$4 man="" k nparts missing="" sha size f
  BUNDLE_WHY="" BSHA=""
  for k in 1 2 3 4 5 6 7 8 9; do
    f=$(bundle_partdir "$root" "$prefix" "$stash" "$k")/MANIFEST
    [ -f "$f" ] && { man=$f; break; }
  done
  if [ -z "$man" ]; then
    BUNDLE_WHY="no ${prefix}N/MANIFEST in $root or $stash: make the bundle where pip works and carry its parts with stash"
    return 1
  fi
  read -r _ BSHA _ nparts < <(grep '^bundle ' "$man")
  log "manifest $man: $(head -1 "$man"); bundle $BSHA, $nparts parts"
  if [ -f "$work/bundle.ok" ] && [ "$(cat "$work/bundle.ok")" = "$BSHA" ]; then
    log "bundle already reassembled and checked in $work (an earlier run on this machine)"
    return 0
  fi
  rm -rf "$work/bundle" "$work/bundle.tar" "$work/bundle.ok"
  mkdir -p "$work" || { BUNDLE_WHY="cannot make $work"; return 1; }
  while read -r _ k sha size; do
    f=$(bundle_partdir "$root" "$prefix" "$stash" "$k")/bundle.tar.$k
    if [ ! -f "$f" ]; then missing+=" $prefix$k (neither here nor in $stash: carry it with stash on a call to this machine while it is warm)"
    elif [ "$(stat -c %s "$f")" != "$size" ] || [ "$(sha256sum <"$f" | cut -d' ' -f1)" != "$sha" ]; then
      missing+=" $prefix$k (size or sha256 differs from MANIFEST: made by another run?)"
    fi
  done < <(grep '^part ' "$man")
  if [ -n "$missing" ]; then BUNDLE_WHY="parts missing or damaged:$missing"; return 1; fi
  for k in $(seq 1 "$nparts"); do cat "$(bundle_partdir "$root" "$prefix" "$stash" "$k")/bundle.tar.$k"; done >"$work/bundle.tar"
  if [ "$(sha256sum <"$work/bundle.tar" | cut -d' ' -f1)" != "$BSHA" ]; then
    BUNDLE_WHY="the reassembled bundle's sha256 differs from MANIFEST"; return 1
  fi
  if ! { mkdir -p "$work/bundle" && tar -xf "$work/bundle.tar" -C "$work/bundle" &&
         (cd "$work/bundle" && sha256sum --quiet -c SHA256SUMS); }; then
    BUNDLE_WHY="the bundle does not unpack or its files fail SHA256SUMS"; return 1
  fi
  echo "$BSHA" >"$work/bundle.ok"; rm -f "$work/bundle.tar"
  log "bundle reassembled and checked: $(cd "$work/bundle" && find . -type f ! -name SHA256SUMS | wc -l) files"
}
