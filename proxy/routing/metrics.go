package routing

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Route metrics are labelled by route (from the config, so few) and by
// small fixed sets (how a peer was found, its state, why a submit was
// refused), never by peer: a route with hundreds of dynamic or DNS peers
// adds no series. Per-peer detail is in stagectl routes.

// Why a submit was refused before anything was moved.
const (
	refuseNoPeer     = iota // names no peer on a route of several (or an ambiguous node name)
	refuseUnknown           // names a peer the route does not have
	refuseNotAllowed        // names an address outside the allow list
	refuseLimit             // a new session would pass limits.max_sessions or max_streams
	refuseDown              // the peer is down: its last dial failed, and so did the one the submit asked for
	refuseReasons
)

var refuseLabels = [refuseReasons]string{"no_peer_named", "unknown_peer", "not_allowed", "limit", "peer_down"}

// routeStats are a route's counters.
type routeStats struct {
	refusals   [refuseReasons]atomic.Uint64
	added      atomic.Uint64 // peers added (static, dns, dynamic)
	drained    atomic.Uint64 // peers drained (removed, gone from DNS, idle)
	dnsLookups atomic.Uint64
	dnsErrors  atomic.Uint64
}

var (
	descRoutePeers    = prometheus.NewDesc("stage_route_peers", "Peers of a route, by how they were found (static, dns, dynamic) and state (up, connecting, down, draining).", []string{"route", "found", "state"}, nil)
	descRouteRefused  = prometheus.NewDesc("stage_route_refused_total", "Submits a route refused before moving anything, by reason: no_peer_named, unknown_peer, not_allowed, limit, peer_down.", []string{"route", "reason"}, nil)
	descRouteChanges  = prometheus.NewDesc("stage_route_peer_changes_total", "Peers a route added and drained.", []string{"route", "change"}, nil)
	descRouteDNS      = prometheus.NewDesc("stage_route_dns_lookups_total", "DNS lookups of a route's dns name, by result (ok, error).", []string{"route", "result"}, nil)
	routeFoundLabels  = []string{foundStatic, foundDNS, foundDynamic}
	routeStateLabels  = []string{"up", "connecting", "down", "draining"}
	routeChangeLabels = []string{"added", "drained"}
)

// Collector reads the routes' peers and counters at scrape time.
func (t *Table[S]) Collector() prometheus.Collector { return collector[S]{t} }

type collector[S Session] struct{ t *Table[S] }

func (c collector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRoutePeers, descRouteRefused, descRouteChanges, descRouteDNS} {
		ch <- d
	}
}

func (c collector[S]) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.t.List() {
		n := map[[2]string]int{}
		r.mu.Lock()
		for _, p := range r.peers {
			n[[2]string{p.found, p.state()}]++
		}
		r.mu.Unlock()
		for _, f := range routeFoundLabels {
			for _, st := range routeStateLabels {
				ch <- prometheus.MustNewConstMetric(descRoutePeers, prometheus.GaugeValue, float64(n[[2]string{f, st}]), r.name, f, st)
			}
		}
		for i, l := range refuseLabels {
			ch <- prometheus.MustNewConstMetric(descRouteRefused, prometheus.CounterValue, float64(r.stats.refusals[i].Load()), r.name, l)
		}
		ch <- prometheus.MustNewConstMetric(descRouteChanges, prometheus.CounterValue, float64(r.stats.added.Load()), r.name, routeChangeLabels[0])
		ch <- prometheus.MustNewConstMetric(descRouteChanges, prometheus.CounterValue, float64(r.stats.drained.Load()), r.name, routeChangeLabels[1])
		ch <- prometheus.MustNewConstMetric(descRouteDNS, prometheus.CounterValue, float64(r.stats.dnsLookups.Load()), r.name, "ok")
		ch <- prometheus.MustNewConstMetric(descRouteDNS, prometheus.CounterValue, float64(r.stats.dnsErrors.Load()), r.name, "error")
	}
}
