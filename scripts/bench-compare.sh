#!/usr/bin/env bash
# bench-compare.sh: make bench's 4-stripe row (or the single-stream sweep)
# with two staged binaries, interleaved round by round, so that both meet
# the same machine state. One stagectl drives both, so only the sidecar
# differs. Prints one line per run and the medians at the end.
#
#   scripts/bench-compare.sh OLD_DIR NEW_DIR [ROUNDS] [row|sweep]
#
# OLD_DIR and NEW_DIR each hold a staged binary; the stagectl used is
# NEW_DIR's. Build an old one with:
#   git worktree add /tmp/old-wt COMMIT && (cd /tmp/old-wt && go build -o /tmp/old-bin/ ./cmd/staged)
set -euo pipefail

old=${1:?usage: bench-compare.sh OLD_DIR NEW_DIR [ROUNDS] [row|sweep]}
new=${2:?usage: bench-compare.sh OLD_DIR NEW_DIR [ROUNDS] [row|sweep]}
rounds=${3:-5}
what=${4:-row}
for d in "$old" "$new"; do
	[ -x "$d/staged" ] || { echo "bench-compare: no executable $d/staged" >&2; exit 2; }
done
ctl=$new/stagectl
[ -x "$ctl" ] || { echo "bench-compare: no executable $ctl" >&2; exit 2; }

case $what in
row) args=(--raw --stripes 4 --size 1GiB --block 4MiB --iters 5) ;;
sweep) args=(--sweep --raw --stripes 1 --size 256MiB --iters 5) ;;
*) echo "bench-compare: unknown shape $what (row or sweep)" >&2; exit 2 ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$rounds"); do
	for side in old new; do
		dir=$old
		[ "$side" = new ] && dir=$new
		"$ctl" bench --spawn --staged "$dir/staged" "${args[@]}" --json >"$tmp/$side-$i.json"
	done
done

python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for i in range(1, rounds + 1):
    for side in ("old", "new"):
        d = json.load(open(f"{tmp}/{side}-{i}.json"))
        for r in d["results"]:
            rows.setdefault((r["stripes"] if "stripes" in r else 0, r["block_bytes"]), {}).setdefault(side, []).append(r["gb_per_s"])
print("block      old GB/s (median, min..max)   new GB/s (median, min..max)   new/old")
for (_, block), v in sorted(rows.items()):
    o, n = v["old"], v["new"]
    print(f"{block >> 10:>7} KiB  {statistics.median(o):6.3f} ({min(o):.3f}..{max(o):.3f})"
          f"        {statistics.median(n):6.3f} ({min(n):.3f}..{max(n):.3f})"
          f"        {statistics.median(n) / statistics.median(o):.3f}")
PY
