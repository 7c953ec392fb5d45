package dl

import (
	"fmt"
	"sort"
	"strings"
	"unsafe"
)

// Required is the group of the symbols a binding cannot work without.
// Other groups are optional; what each means is the binding's own.
const Required = 0

// Sym is one entry of a binding's symbol table.
type Sym struct {
	Name  string
	Group int // Required, or one of the binding's optional groups
}

// Bind looks up every symbol of table in h and hands each one found to set
// with its index in table. It returns the names not found, by group, in
// table order.
func (h *Handle) Bind(table []Sym, set func(i int, p unsafe.Pointer)) map[int][]string {
	missing := map[int][]string{}
	for i, s := range table {
		p := h.Lookup(s.Name)
		if p == nil {
			missing[s.Group] = append(missing[s.Group], s.Name)
			continue
		}
		set(i, p)
	}
	return missing
}

// MissingError is the error of a library that lacks required symbols:
// "cuda: PATH: missing a, b; driver too old?".
func MissingError(lib, path string, names []string, hint string) error {
	return fmt.Errorf("%s: %s: missing %s; %s", lib, path, strings.Join(names, ", "), hint)
}

// Absent records what a library lacks of its optional symbols: each name
// with what its absence costs. The vendor backends' Library.Absent returns
// a copy.
type Absent map[string]string

// Copy returns a copy the caller may keep.
func (a Absent) Copy() map[string]string {
	m := make(map[string]string, len(a))
	for k, v := range a {
		m[k] = v
	}
	return m
}

// List renders a sorted, one "name: reason" per entry.
func (a Absent) List() []string {
	out := make([]string, 0, len(a))
	for k, v := range a {
		out = append(out, k+": "+v)
	}
	sort.Strings(out)
	return out
}

// ErrorText is the one form of a failed vendor call's message, whatever
// the vendor: "cuda: cuMemcpyDtoHAsync(4194304 B from 0x7f00): NAME: text".
// lib is the package ("cuda", "acl", "hip"), op the call with the values
// involved, name the vendor's name of the code, msg the vendor's text of it
// (left out when empty or the same as name).
func ErrorText(lib, op, name, msg string) string {
	s := lib + ": " + op + ": " + name
	if msg != "" && msg != name {
		s += ": " + msg
	}
	return s
}
