package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/wire"
)

// metrics are the figures Prometheus scrapes. Counters that stats already
// keeps (per link) are read at scrape time by a collector; what only
// metrics need (histograms, time spent) is observed here.
type metrics struct {
	reg       *prometheus.Registry
	duration  *prometheus.HistogramVec // transfer latency by direction and result
	errors    *prometheus.CounterVec   // failures by code
	fallbacks *prometheus.CounterVec   // transport fallbacks by reason
	kvWaits   *prometheus.CounterVec   // peers' KV requests that waited for a grant, a registration or an inbox (kvpark.go)
	kvWaiting *prometheus.GaugeVec     // those waiting now
	copyNanos [2]atomic.Int64          // gather, scatter: device copy time (enqueue to done)
	netNanos  [2]atomic.Int64          // send, receive: time in writev / recv of payloads
	renewals  atomic.Int64             // spliced send slots given fresh pages
	stalls    atomic.Int64             // data streams dropped by the stall watchdog (stall.go)
	kvAccepts atomic.Uint64            // KV transfers accepted from local engines
	kvAcceptN atomic.Uint64            // nanoseconds spent accepting them (kv.go)
}

const (
	copyGather  = 0
	copyScatter = 1
	netSend     = 0
	netRecv     = 1
)

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "stage", Name: "transfer_duration_seconds",
		Help:    "Time from submit to the end of transfers submitted by local engines.",
		Buckets: prometheus.ExponentialBuckets(20e-6, 2.5, 14), // 20us .. ~30s
	}, []string{"direction", "result"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "stage", Name: "errors_total",
		Help: "Failed transfers and refused requests, by error code.",
	}, []string{"code"})
	m.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "stage", Name: "transport_fallbacks_total",
		Help: "Transfers that could not use the transport a route asked for and fell back, by reason.",
	}, []string{"reason"})
	m.kvWaits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "stage", Name: "kv_waits_total",
		Help: "Peers' KV requests that came before what they need and waited for it: for a grant (a push or pull), for the cache's registration (a shape question) or for an inbox to open (a push ticket), by whether it came in time.",
	}, []string{"for", "result"})
	m.kvWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "stage", Name: "kv_waiting",
		Help: "Peers' KV requests waiting now for a grant, the cache's registration or an inbox (each counted in stage_kv_waits_total when it ends).",
	}, []string{"for"})
	m.reg.MustRegister(m.duration, m.errors, m.fallbacks, m.kvWaits, m.kvWaiting, &collector{s: s, m: m}, s.routes.Collector(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// kvWaitStarts shows a peer's KV request waiting for what (grant,
// registration, inbox); the wait ends with kvWaited, or kvWaitGone when the
// session ended first.
func (m *metrics) kvWaitStarts(what string) { m.kvWaiting.WithLabelValues(what).Inc() }

// kvWaitGone ends a wait whose session ended first.
func (m *metrics) kvWaitGone(what string) { m.kvWaiting.WithLabelValues(what).Dec() }

// kvWaited ends and counts a peer's KV request that waited for what
// (grant, registration, inbox); came says whether it came in time.
func (m *metrics) kvWaited(what string, came bool) {
	m.kvWaiting.WithLabelValues(what).Dec()
	result := "came"
	if !came {
		result = "timed_out"
	}
	m.kvWaits.WithLabelValues(what, result).Inc()
}

// codeLabel turns a wire code into a label value: "out of range" -> "out_of_range".
func codeLabel(c wire.Code) string { return strings.ReplaceAll(c.String(), " ", "_") }

func (m *metrics) transferDone(dir wire.Direction, start time.Time, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
		m.errors.WithLabelValues(codeLabel(errCode(err))).Inc()
	}
	m.duration.WithLabelValues(dir.String(), result).Observe(time.Since(start).Seconds())
}

// collector reads the sidecar's own counters at scrape time.
type collector struct {
	s *Server
	m *metrics
}

var (
	descBytes     = prometheus.NewDesc("stage_bytes_total", "Payload bytes moved over data streams, by link and direction.", []string{"link", "direction"}, nil)
	descChunks    = prometheus.NewDesc("stage_chunks_total", "Chunks moved over data streams, by link and direction.", []string{"link", "direction"}, nil)
	descXfers     = prometheus.NewDesc("stage_transfers_total", "Finished transfers, by link and result.", []string{"link", "result"}, nil)
	descInline    = prometheus.NewDesc("stage_transfers_inline_total", "Small pushes sent on the latency path (counted in stage_transfers_total too), by link.", []string{"link"}, nil)
	descSessions  = prometheus.NewDesc("stage_sessions", "Peer sessions up, by link.", []string{"link"}, nil)
	descSlots     = prometheus.NewDesc("stage_staging_slots", "Pinned staging slots, by pool.", []string{"pool"}, nil)
	descSlotsUsed = prometheus.NewDesc("stage_staging_slots_in_use", "Pinned staging slots in use, by pool.", []string{"pool"}, nil)
	descSlotBytes = prometheus.NewDesc("stage_staging_slot_bytes", "Size of one pinned staging slot.", nil, nil)
	descRegions   = prometheus.NewDesc("stage_regions", "Regions registered by local engines.", nil, nil)
	descMappings  = prometheus.NewDesc("stage_mappings", "Engine allocations mapped into the sidecar.", nil, nil)
	descActive    = prometheus.NewDesc("stage_transfers_active", "Transfers submitted by local engines and not finished.", nil, nil)
	descCopy      = prometheus.NewDesc("stage_copy_seconds_total", "Device copy time of staging chunks, enqueue to completion, by kind.", []string{"kind"}, nil)
	descRedials   = prometheus.NewDesc("stage_stream_redials_total", "Data streams dialed again after one was lost, by link.", []string{"link"}, nil)
	descResent    = prometheus.NewDesc("stage_chunks_resent_total", "Chunks sent again because the peer found them damaged (CRC32C), by link.", []string{"link"}, nil)
	descCRCErrs   = prometheus.NewDesc("stage_checksum_errors_total", "Chunks that arrived damaged (CRC32C mismatch), by link.", []string{"link"}, nil)
	descDups      = prometheus.NewDesc("stage_duplicate_chunks_total", "Second copies of chunks that had landed already (sent again after a stream loss), by link.", []string{"link"}, nil)
	descNet       = prometheus.NewDesc("stage_network_seconds_total", "Time spent in socket calls moving chunk payloads, by direction.", []string{"direction"}, nil)
	descRefused   = prometheus.NewDesc("stage_preauth_refused_total", "Peer connections closed as soon as accepted because too many handshakes were in progress, by bound: total (limits.max_handshakes) or per_addr (limits.max_handshakes_per_addr).", []string{"reason"}, nil)
	descPreauth   = prometheus.NewDesc("stage_preauth_connections", "Peer connections accepted whose handshake is in progress.", nil, nil)
	descStalls    = prometheus.NewDesc("stage_stream_stalls_total", "Data streams dropped because they moved no bytes for staging.stall_timeout with a chunk to write or half read.", nil, nil)
	descRenewals  = prometheus.NewDesc("stage_send_slot_renewals_total", "Send slots given fresh pages because a chunk spliced from them was given up unanswered (splice send).", nil, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBytes, descChunks, descXfers, descInline, descSessions, descSlots, descSlotsUsed,
		descSlotBytes, descRegions, descMappings, descActive, descCopy, descNet, descRedials, descResent, descCRCErrs, descDups, descRenewals, descRefused, descPreauth, descStalls} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Snapshot()
	for _, l := range st.Links {
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(l.BytesOut), l.Name, "out")
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(l.BytesIn), l.Name, "in")
		ch <- prometheus.MustNewConstMetric(descChunks, prometheus.CounterValue, float64(l.ChunksOut), l.Name, "out")
		ch <- prometheus.MustNewConstMetric(descChunks, prometheus.CounterValue, float64(l.ChunksIn), l.Name, "in")
		ch <- prometheus.MustNewConstMetric(descXfers, prometheus.CounterValue, float64(l.XfersOK), l.Name, "ok")
		ch <- prometheus.MustNewConstMetric(descXfers, prometheus.CounterValue, float64(l.XfersFailed), l.Name, "failed")
		ch <- prometheus.MustNewConstMetric(descInline, prometheus.CounterValue, float64(l.XfersInline), l.Name)
		ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(l.Up), l.Name)
		ch <- prometheus.MustNewConstMetric(descRedials, prometheus.CounterValue, float64(l.Redials), l.Name)
		ch <- prometheus.MustNewConstMetric(descResent, prometheus.CounterValue, float64(l.Resends), l.Name)
		ch <- prometheus.MustNewConstMetric(descCRCErrs, prometheus.CounterValue, float64(l.ChecksumErrors), l.Name)
		ch <- prometheus.MustNewConstMetric(descDups, prometheus.CounterValue, float64(l.Duplicates), l.Name)
	}
	ch <- prometheus.MustNewConstMetric(descSlots, prometheus.GaugeValue, float64(st.SendSlots), "send")
	ch <- prometheus.MustNewConstMetric(descSlots, prometheus.GaugeValue, float64(st.RecvSlots), "recv")
	ch <- prometheus.MustNewConstMetric(descSlotsUsed, prometheus.GaugeValue, float64(st.SendInUse), "send")
	ch <- prometheus.MustNewConstMetric(descSlotsUsed, prometheus.GaugeValue, float64(st.RecvInUse), "recv")
	ch <- prometheus.MustNewConstMetric(descSlotBytes, prometheus.GaugeValue, float64(st.SlotSize))
	ch <- prometheus.MustNewConstMetric(descRegions, prometheus.GaugeValue, float64(st.Regions))
	ch <- prometheus.MustNewConstMetric(descMappings, prometheus.GaugeValue, float64(st.Mappings))
	ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(st.Transfers))
	ch <- prometheus.MustNewConstMetric(descCopy, prometheus.CounterValue, float64(c.m.copyNanos[copyGather].Load())/1e9, "gather")
	ch <- prometheus.MustNewConstMetric(descCopy, prometheus.CounterValue, float64(c.m.copyNanos[copyScatter].Load())/1e9, "scatter")
	ch <- prometheus.MustNewConstMetric(descNet, prometheus.CounterValue, float64(c.m.netNanos[netSend].Load())/1e9, "send")
	ch <- prometheus.MustNewConstMetric(descNet, prometheus.CounterValue, float64(c.m.netNanos[netRecv].Load())/1e9, "receive")
	ch <- prometheus.MustNewConstMetric(descRenewals, prometheus.CounterValue, float64(c.m.renewals.Load()))
	for r, label := range refusedLabels {
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(c.s.preauth.refused[r].Load()), label)
	}
	ch <- prometheus.MustNewConstMetric(descPreauth, prometheus.GaugeValue, float64(c.s.preauth.inProgress()))
	ch <- prometheus.MustNewConstMetric(descStalls, prometheus.CounterValue, float64(c.m.stalls.Load()))
}

// serveMetrics serves /metrics, /healthz and /readyz on addr (metrics.listen).
func (s *Server) serveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics.listen %s: %w", addr, err)
	}
	s.metricsLn = ln
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.closing.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Warn("metrics server stopped", zap.Error(err))
		}
	}()
	s.metricsSrv = srv
	return nil
}

// MetricsAddr is where /metrics is served ("" when off).
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}
