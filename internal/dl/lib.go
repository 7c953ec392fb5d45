package dl

import (
	"fmt"
	"unsafe"
)

// Binding is what a vendor backend tells Load about its library: its
// symbol table and the words its errors use. The C side (a struct of
// function pointers and the trampolines calling them) stays in the
// backend's cgo shim, since cgo types are per package; set stores one
// resolved symbol into it.
type Binding struct {
	Lib     string // the backend: "cuda", "acl", "hip"; prefixes every error
	Install string // what to check when dlopen fails ("is the NVIDIA driver installed ...?")
	TooOld  string // what missing required symbols suggest ("driver too old?")
	Table   []Sym
	Set     func(i int, p unsafe.Pointer) // stores Table[i]'s address
	// Absent says what lacking an optional symbol costs, for Absent and
	// the log line at open.
	Absent func(group int, name string) string
}

// Lib is a vendor library opened and bound by Load. The backends' Library
// types embed it, so Path, Absent, AbsentList, Missing and Close are the
// same words in each; Call reads the counters of the emulation libraries
// their tests load. Safe for concurrent use once Load returned.
type Lib struct {
	*Handle
	absent  Absent
	missing map[int][]string
}

// Load opens the library at path (RTLD_NOW) and binds every symbol of
// b.Table. Errors name the library file: "cuda: dlopen PATH: <dlerror>;
// INSTALL" when it cannot be opened, and "cuda: PATH: missing a, b;
// TOOOLD" listing every required symbol it lacks (the library is closed
// again). Optional symbols it lacks are not errors: Absent lists each with
// b.Absent's reason, and Missing by group.
func Load(path string, b Binding) (*Lib, error) {
	h, err := Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; %s", b.Lib, err, b.Install)
	}
	missing := h.Bind(b.Table, b.Set)
	if req := missing[Required]; len(req) > 0 {
		h.Close()
		return nil, MissingError(b.Lib, path, req, b.TooOld)
	}
	l := &Lib{Handle: h, absent: Absent{}, missing: missing}
	for group, names := range missing {
		for _, name := range names {
			l.absent[name] = b.Absent(group, name)
		}
	}
	return l, nil
}

// Absent maps each optional symbol the library lacks to what that costs.
// The map is a copy the caller may keep.
func (l *Lib) Absent() map[string]string { return l.absent.Copy() }

// AbsentList renders Absent sorted, one "name: reason" per entry.
func (l *Lib) AbsentList() []string { return l.absent.List() }

// Missing lists the optional symbols of group the library lacks, in table
// order.
func (l *Lib) Missing(group int) []string { return l.missing[group] }
