"""Runs of peer-compare.sh and gpu-peers.sh, recorded one JSON object a line,
and the table made of them.

  table.py record RUNS CASE PEER --peer-json     < peer.py's output line
  table.py record RUNS CASE stage --stage-json   < stagectl bench --raw --json output (two records: stage, raw)
  table.py record RUNS CASE PEER --error WHY     (a run that did not run or failed)
  table.py print RUNS [CASE ...]

CASE is PATTERN:BLOCK:STREAMS (ranges:1048576:1). A record is
{"case", "peer", "gbps": [...], "verify", "error"}. The table gives, per case
and peer, the median GB/s over all timed transfers (min-max), the ratio of
the median to raw TCP's and to stage's in the same case, and the checks of
the destination; a peer with no figures says why.
"""
import json
import statistics
import sys

PEERS = ("raw", "stage", "nixl", "mooncake")


def add(runs, rec):
    with open(runs, "a") as f:
        f.write(json.dumps(rec) + "\n")


def record(argv):
    runs, case, peer, how = argv[:4]
    base = {"case": case, "peer": peer, "gbps": [], "verify": "", "error": ""}
    if how == "--error":
        add(runs, dict(base, error=" ".join(argv[4:]) or "unknown"))
        return
    text = sys.stdin.read().strip()
    try:
        d = json.loads(text.splitlines()[-1] if how == "--peer-json" else text)
        if how == "--peer-json":
            add(runs, dict(base, gbps=[float(g) for g in d["gbps"]], verify=d.get("verify", "not checked")))
        else:  # --stage-json: stagectl bench --json, one result, raw TCP beside it
            r = d["results"][0]
            add(runs, dict(base, peer="stage", gbps=[float(r["gb_per_s"])],
                           verify="ok" if r.get("verified") else "not checked"))
            if d.get("raw_tcp"):
                add(runs, dict(base, peer="raw", gbps=[float(d["raw_tcp"]["gb_per_s"])], verify="-"))
    except (ValueError, KeyError, IndexError, TypeError) as e:
        add(runs, dict(base, error=f"unreadable output ({type(e).__name__}: {e}): {text[-200:]!r}"))


def label(case):
    pat, block, streams = case.split(":")
    b = int(block)
    size = f"{b >> 20}MiB" if b % (1 << 20) == 0 else f"{b >> 10}KiB"
    return f"{size} {pat} x{streams}"


def verify_summary(recs):
    vs = [r["verify"] for r in recs if r["gbps"]]
    if not vs or all(v == "-" for v in vs):
        return "-"
    bad = [v for v in vs if v != "ok"]
    if not bad:
        return f"ok {len(vs)}/{len(vs)}"
    return f"NOT ok {len(bad)}/{len(vs)}: {bad[0]}"


def show(argv):
    runs = argv[0]
    recs = []
    try:
        with open(runs) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        pass
    cases = argv[1:] or sorted({r["case"] for r in recs})
    print("%-18s %-9s %20s %8s %8s  %s" % ("CASE", "PEER", "GB/s med (min-max)", "/rawTCP", "/stage", "verify"))
    peers = PEERS + tuple(sorted({r["peer"] for r in recs} - set(PEERS)))
    for c in cases:
        mine = [r for r in recs if r["case"] == c]
        vals = {p: [g for r in mine if r["peer"] == p for g in r["gbps"]] for p in peers}
        med = {p: statistics.median(v) for p, v in vals.items() if v}
        for p in peers:
            v = vals[p]
            rs = [r for r in mine if r["peer"] == p]
            if not v:
                # raw TCP is measured by stage's runs: without any, stage's reason is raw's
                src = rs if rs or p != "raw" else [r for r in mine if r["peer"] == "stage"]
                errs = [r["error"] for r in src if r["error"]]
                why = errs[-1] if errs else "did not run: no record"
                print("%-18s %-9s %s" % (label(c), p, why))
                continue
            rr = "%.2f" % (med[p] / med["raw"]) if "raw" in med else "-"
            rst = "%.2f" % (med[p] / med["stage"]) if "stage" in med else "-"
            note = verify_summary(rs)
            failed = [r["error"] for r in rs if r["error"]]
            if failed:
                note += f"; {len(failed)} other run(s): {failed[-1]}"
            print("%-18s %-9s %7.2f (%5.2f-%5.2f) %8s %8s  %s" % (label(c), p, med[p], min(v), max(v), rr, rst, note))


def main():
    if len(sys.argv) >= 6 and sys.argv[1] == "record":
        record(sys.argv[2:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "print":
        show(sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
