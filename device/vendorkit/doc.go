// Package vendorkit is the scaffold the vendor backends (acl, cuda, hip)
// share, written once over each backend's runtime calls:
//
//   - Core: a Device's name ("acl:0"), its closed flag, its lock and the
//     counts of what is open on it, its errors ("acl: acl:0: ...") and its
//     Close (what was left open);
//   - the tables of what a device handed out: pinned host buffers (Pins,
//     TakePin) and engine-side device allocations (AllocDevice,
//     FreeDevice), and the synchronous copies' checks (CopyHtoD, CopyDtoH);
//   - Export of an allocation's base by a handle (ExportBase);
//   - Gate, the lock and closed flag of a stream or event, and the checks
//     of a Gather or Scatter's segments (CheckMove);
//   - OpenShared, the opener over a process-wide library; ParseMode, a
//     copy mode as its config key spells it; Codes, a runtime's error codes
//     as device's sentinels.
//
// A backend keeps its cgo calls, its error names and what only it does
// (acl's pack ring, cuda's kernels, hip's import cache).
package vendorkit
