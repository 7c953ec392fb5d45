package vendorkit_test

import (
	"reflect"
	"testing"

	"github.com/stage-kv/stage/acl"
	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device/vendorkit"
	"github.com/stage-kv/stage/hip"
)

// TestBackendsKeepTheirAPI: the scaffold is the backends' own business.
// A backend's exported types must not gain Core's or Gate's methods and
// fields (an engine could otherwise Shut a device or take its lock).
func TestBackendsKeepTheirAPI(t *testing.T) {
	var inner []string
	for _, typ := range []reflect.Type{reflect.TypeFor[*vendorkit.Core](), reflect.TypeFor[*vendorkit.Gate]()} {
		for i := range typ.NumMethod() {
			inner = append(inner, typ.Method(i).Name)
		}
		for i := range typ.Elem().NumField() {
			if f := typ.Elem().Field(i); f.IsExported() {
				inner = append(inner, f.Name)
			}
		}
	}
	// Ordinal, String and Close are device.Device's (and Stream's, Event's,
	// Mapping's) own words; the backends define them.
	own := map[string]bool{"Ordinal": true, "String": true, "Close": true}
	for _, typ := range []reflect.Type{
		reflect.TypeFor[*acl.Device](), reflect.TypeFor[*acl.Stream](), reflect.TypeFor[*acl.Event](),
		reflect.TypeFor[*cuda.Device](), reflect.TypeFor[*cuda.Stream](), reflect.TypeFor[*cuda.Event](),
		reflect.TypeFor[*hip.Device](), reflect.TypeFor[*hip.Stream](), reflect.TypeFor[*hip.Event](), reflect.TypeFor[*hip.Mapping](),
	} {
		for _, name := range inner {
			if own[name] {
				continue
			}
			_, isMethod := typ.MethodByName(name)
			_, isField := typ.Elem().FieldByName(name)
			if isMethod || isField {
				t.Errorf("%v has vendorkit's %s: embed the scaffold in an unexported field", typ, name)
			}
		}
	}
}
