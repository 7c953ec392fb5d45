package device

// Capability names one optional interface of this package. Callers find a
// capability by type assertion at run time and fall back without it (a
// same-node path without DtoD stages over TCP; a device without SyncCopier
// moves small pushes through a stream); the table of which backend has
// which is each backend's Backend.Caps.
type Capability string

// The optional interfaces, Device's first, then Stream's.
const (
	CapSyncCopier     Capability = "SyncCopier"     // Device: copies on the calling goroutine
	CapHostRegisterer Capability = "HostRegisterer" // Device: pins host memory someone else mapped
	CapSlotRenewer    Capability = "SlotRenewer"    // Device: fresh pages under a spliced slot
	CapExporter       Capability = "Exporter"       // Device: shares its memory with another process
	CapDtoD           Capability = "DtoD"           // Stream: device-to-device copies
	CapDtoDBatch      Capability = "DtoDBatch"      // Stream: many device-to-device copies at once
	CapRunCopier      Capability = "RunCopier"      // Stream: strided runs without expanding them
)

// Implements lists, in the order of the constants above, the capabilities
// dev and s have by type assertion: what a backend really implements,
// whatever it declares. Either may be nil.
func Implements(dev Device, s Stream) []Capability {
	checks := []struct {
		ok bool
		c  Capability
	}{
		{is[SyncCopier](dev), CapSyncCopier},
		{is[HostRegisterer](dev), CapHostRegisterer},
		{is[SlotRenewer](dev), CapSlotRenewer},
		{is[Exporter](dev), CapExporter},
		{is[DtoD](s), CapDtoD},
		{is[DtoDBatch](s), CapDtoDBatch},
		{is[RunCopier](s), CapRunCopier},
	}
	var out []Capability
	for _, c := range checks {
		if c.ok {
			out = append(out, c.c)
		}
	}
	return out
}

// is reports whether v (nil: no) implements I.
func is[I any](v any) bool {
	_, ok := v.(I)
	return ok
}
