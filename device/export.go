package device

// Export is what an engine process sends its sidecar to share the device
// memory at an address. Handles name whole allocations, and a vendor
// runtime maps an imported handle at the allocation's base whatever
// pointer it was made from, so the address travels as the base's handle
// plus its offset inside the allocation: the importer adds Offset back to
// the base it mapped. Dropping the offset moves the wrong bytes, silently.
type Export struct {
	// Handle shares the allocation holding the address: Kind and Bytes
	// as the backend's Import wants them, Size the allocation's size
	// (which the importer checks claims against), FD -1.
	Handle Handle
	// Base is the allocation's first byte in the exporting process.
	Base Addr
	// Offset is the exported address minus Base.
	Offset uint64
}

// Exporter is implemented by Devices that share their memory with another
// process (cuda: a legacy IPC handle; acl: an export key; hip: an IPC
// handle): what an engine, or a test or tool standing in for one, calls.
// The sidecar itself only imports.
type Exporter interface {
	// Export shares the allocation holding addr, any address inside
	// memory of this device. importers are the ids of the processes
	// allowed to import, for backends that can restrict them (acl: each
	// its BareTgid); the others ignore them, and with none given any
	// process that learns the handle may import.
	Export(addr Addr, importers ...int32) (Export, error)
}
