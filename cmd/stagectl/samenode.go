package main

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/stage-kv/stage/wire"
)

// printSameNode lists, per link, the transfers that moved on a same-node
// path and those that fell back to TCP, by reason (nothing when none did).
func printSameNode(w io.Writer, st *wire.Stats) {
	for _, l := range st.Links {
		if l.XfersIPC == 0 && l.XfersShm == 0 && len(l.Fallbacks) == 0 {
			continue
		}
		reasons := make([]string, 0, len(l.Fallbacks))
		for r, n := range l.Fallbacks {
			reasons = append(reasons, fmt.Sprintf("%s=%d", r, n))
		}
		sort.Strings(reasons)
		fb := "none"
		if len(reasons) > 0 {
			fb = strings.Join(reasons, " ")
		}
		fmt.Fprintf(w, "same node %s: ipc %d, shm %d; fallbacks to tcp: %s\n", l.Name, l.XfersIPC, l.XfersShm, fb)
	}
	if st.PeerMappings > 0 {
		fmt.Fprintf(w, "peer mappings (imported from same-node peers): %d\n", st.PeerMappings)
	}
}

// transportCell shows the route's transport and, when it differs, what the
// peer's next transfer uses.
func transportCell(route, peer string) string {
	if peer == "" || peer == route {
		return route
	}
	return route + " -> " + peer
}
