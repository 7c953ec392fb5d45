#!/usr/bin/env bash
# bench-compare.sh: make bench's 4-stripe row (or the single-stream sweep)
# with two staged binaries, interleaved round by round, so that both meet
# the same machine state. One stagectl drives both, so only the sidecar
# differs. Prints one line per run and the medians at the end.
#
#   scripts/bench-compare.sh OLD_DIR NEW_DIR [ROUNDS] [row|sweep|ranges|blocks] [BENCH FLAGS...]
#
# ranges: 1 GiB in 1 MiB ranges, blocks: 1 GiB in 65,536 scattered 16 KiB
# blocks (8 stripes each, every byte checked after the last transfer);
# flags after the shape go to every bench (e.g. --device cuda:0
# --remote-device cuda:1 on the GPU machine).
#
# OLD_DIR and NEW_DIR each hold a staged binary; the stagectl used is
# NEW_DIR's. Build an old one with:
#   git worktree add /tmp/old-wt COMMIT && (cd /tmp/old-wt && go build -o /tmp/old-bin/ ./cmd/staged)
set -euo pipefail

old=${1:?usage: bench-compare.sh OLD_DIR NEW_DIR [ROUNDS] [row|sweep|ranges|blocks] [BENCH FLAGS...]}
new=${2:?usage: bench-compare.sh OLD_DIR NEW_DIR [ROUNDS] [row|sweep|ranges|blocks] [BENCH FLAGS...]}
rounds=${3:-5}
what=${4:-row}
shift $(($# < 4 ? $# : 4))
for d in "$old" "$new"; do
	[ -x "$d/staged" ] || { echo "bench-compare: no executable $d/staged" >&2; exit 2; }
done
ctl=$new/stagectl
[ -x "$ctl" ] || { echo "bench-compare: no executable $ctl" >&2; exit 2; }

case $what in
row) args=(--raw --stripes 4 --size 1GiB --block 4MiB --iters 5) ;;
sweep) args=(--sweep --raw --stripes 1 --size 256MiB --iters 5) ;;
ranges) args=(--stripes 8 --size 1GiB --block 1MiB --iters 5 --verify-end) ;;
blocks) args=(--stripes 8 --size 1GiB --block 16KiB --pattern blocks --iters 5 --verify-end) ;;
*) echo "bench-compare: unknown shape $what (row, sweep, ranges or blocks)" >&2; exit 2 ;;
esac
args+=("$@")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$rounds"); do
	for side in old new; do
		dir=$old
		[ "$side" = new ] && dir=$new
		"$ctl" bench --spawn --staged "$dir/staged" "${args[@]}" --json >"$tmp/$side-$i.json" ||
			{ echo "bench-compare: $side round $i failed" >&2; exit 1; }
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
