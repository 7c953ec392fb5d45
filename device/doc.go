// Package device defines what stage needs from an accelerator runtime: pinned
// host slabs with both a host and a device view, imported allocations shared
// by engine processes, asynchronous streams with gather/scatter copies, and
// events that say when those copies are done.
//
// Backends (cuda, acl, hip, device/hostmem) implement Device and register an
// opener with Register; the sidecar picks one with Open. Each also declares
// the optional interfaces (Capability) its Devices and Streams implement,
// and capability_test.go holds every declaration against the real type
// assertions (go test -v -run Capabilities ./device/ prints the table). This package imports
// nothing of stage's own and does no I/O of its own.
//
// Ownership: a Pinned buffer belongs to whoever allocated it until FreePinned.
// Seg slices passed to Gather and Scatter may be reused as soon as the call
// returns; the bytes they name must stay mapped until the event recorded after
// the copy has completed.
package device
