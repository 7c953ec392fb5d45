package proxytest

import (
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// MetricsURL is the address of path (e.g. "/metrics") on the sidecar's
// metrics listener; Options.Metrics must be set.
func (s *Sidecar) MetricsURL(path string) string {
	if s.MetricsAddr() == "" {
		panic("proxytest: sidecar " + s.Name + " serves no metrics; set Options.Metrics")
	}
	return "http://" + s.MetricsAddr() + path
}

// LogText is what the sidecar logged so far (info and up), a line per
// entry in zap's console encoding, as staged writes its log: tests of
// what a sidecar says match the same text against both.
func (s *Sidecar) LogText() string {
	enc := zapcore.NewConsoleEncoder(zap.NewProductionEncoderConfig())
	var b strings.Builder
	for _, e := range s.Logs.All() {
		buf, err := enc.EncodeEntry(e.Entry, e.Context)
		if err != nil { // only a field zap cannot encode fails; keep its message
			b.WriteString(e.Message + "\n")
			continue
		}
		b.Write(buf.Bytes())
		buf.Free()
	}
	return b.String()
}
