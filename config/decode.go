package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// leafError is a decode hook's own message for a bad value.
type leafError struct{ msg string }

func (e *leafError) Error() string { return e.msg }

func badValue(format string, args ...any) error {
	return &leafError{msg: fmt.Sprintf(format, args...)}
}

// decodeHook converts what YAML, env vars and flags produce into the field's
// type: durations and sizes from strings, numbers from env strings, and
// rejects lossy conversions (a fraction into an integer, a negative size).
func decodeHook(_ reflect.Type, to reflect.Type, data any) (any, error) {
	switch to {
	case durationType:
		return toDuration(data)
	case byteSizeType:
		return toByteSize(data)
	case depthType:
		return toDepth(data)
	case spinType:
		return toSpin(data)
	}
	s, isString := data.(string)
	switch to.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if isString {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 10, to.Bits())
			if err != nil {
				return nil, badValue("must be an integer")
			}
			return n, nil
		}
		if f, ok := asFloat(data); ok {
			if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
				return nil, badValue("must be a whole number")
			}
			return int64(f), nil
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if isString {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, to.Bits())
			if err != nil {
				return nil, badValue("must be a non-negative integer")
			}
			return n, nil
		}
	case reflect.Float32, reflect.Float64:
		if isString {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil {
				return nil, badValue("must be a number")
			}
			return f, nil
		}
	case reflect.Bool:
		if isString {
			b, err := strconv.ParseBool(strings.TrimSpace(s))
			if err != nil {
				return nil, badValue("must be true or false")
			}
			return b, nil
		}
	}
	return data, nil
}

func asFloat(data any) (float64, bool) {
	switch f := data.(type) {
	case float64:
		return f, true
	case float32:
		return float64(f), true
	}
	return 0, false
}

func toDuration(data any) (any, error) {
	const want = "must be a duration with a unit, like 500ms, 5s or 1m"
	switch d := data.(type) {
	case time.Duration:
		return d, nil
	case string:
		v, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil {
			return nil, badValue(want)
		}
		return v, nil
	}
	rv := reflect.ValueOf(data)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if rv.Int() == 0 {
			return time.Duration(0), nil
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if rv.Uint() == 0 {
			return time.Duration(0), nil
		}
	}
	return nil, badValue(want)
}

func toByteSize(data any) (any, error) {
	switch d := data.(type) {
	case ByteSize:
		return d, nil
	case string:
		v, err := ParseByteSize(d)
		if err != nil {
			return nil, badValue("%v; use a size like 4MiB, 512KiB, 1GiB, 64KB or a number of bytes", err)
		}
		return v, nil
	case float32, float64:
		f, _ := asFloat(d)
		if f < 0 {
			return nil, badValue("must not be negative")
		}
		if f != math.Trunc(f) || f >= math.MaxUint64 {
			return nil, badValue("must be a whole number of bytes")
		}
		return ByteSize(f), nil
	}
	rv := reflect.ValueOf(data)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if rv.Int() < 0 {
			return nil, badValue("must not be negative")
		}
		return ByteSize(rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return ByteSize(rv.Uint()), nil
	}
	return nil, badValue("must be a size like 4MiB, 512KiB, 1GiB, 64KB or a number of bytes")
}

// walker checks raw settings against the Config type: unknown keys, wrong
// shapes and values that do not decode, each reported once with its path.
type walker struct {
	problems []Problem
	bad      map[string]bool // keys with a problem
}

func newWalker() *walker { return &walker{bad: map[string]bool{}} }

func (w *walker) add(key, msg string) {
	if w.bad[key] {
		return
	}
	w.bad[key] = true
	w.problems = append(w.problems, Problem{Key: key, Msg: msg})
}

// covers reports whether key is, or lies under, a key already reported, so
// validation does not report it again (a bad value was replaced by its
// default or left out).
func (w *walker) covers(key string) bool {
	for k := key; k != ""; k = parentKey(k) {
		if w.bad[k] {
			return true
		}
	}
	return false
}

// parentKey: "routes[1].peers[0]" -> "routes[1].peers" -> "routes[1]" ->
// "routes" -> "".
func parentKey(k string) string {
	i := strings.LastIndexAny(k, ".[")
	if i < 0 {
		return ""
	}
	return k[:i]
}

// walk checks raw against t at path and returns a copy holding only what
// decodes, and whether raw was usable at all. A nil raw means "not set".
func (w *walker) walk(path string, raw any, t reflect.Type) (any, bool) {
	if raw == nil {
		return nil, false
	}
	switch {
	case t.Kind() == reflect.Struct:
		m, ok := raw.(map[string]any)
		if !ok {
			w.add(pathOrRoot(path), fmt.Sprintf("must be a mapping with keys %s (got %s)", strings.Join(fieldNames(t), ", "), showKey(path, raw)))
			return nil, false
		}
		out := make(map[string]any, len(m))
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			f, ok := fieldByTag(t, k)
			key := joinKey(path, k)
			if !ok {
				msg := fmt.Sprintf("unknown key (got %s)", showKey(key, m[k]))
				if s := suggest(k, fieldNames(t)); s != "" {
					msg += fmt.Sprintf("; did you mean %s?", joinKey(path, s))
				} else {
					msg += "; known keys here: " + strings.Join(fieldNames(t), ", ")
				}
				w.add(key, msg)
				continue
			}
			if v, ok := w.walk(key, m[k], f.Type); ok {
				out[k] = v
			}
		}
		return out, true
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		list, ok := raw.([]any)
		if !ok {
			w.add(path, fmt.Sprintf("must be a list (got %s)", showKey(path, raw)))
			return nil, false
		}
		out := make([]any, len(list))
		for i, e := range list {
			key := fmt.Sprintf("%s[%d]", path, i)
			if e == nil {
				w.add(key, "empty list entry; remove it or give its keys")
				out[i] = map[string]any{}
				continue
			}
			v, ok := w.walk(key, e, t.Elem())
			if !ok {
				v = map[string]any{} // keep the indexes of later entries
			}
			out[i] = v
		}
		return out, true
	}
	// A leaf: decode it alone to see whether it fits.
	dst := reflect.New(t)
	if err := decode(raw, dst.Interface()); err != nil {
		msg := leafWant(t)
		var le *leafError
		if errors.As(err, &le) {
			msg = le.msg
		}
		w.add(path, fmt.Sprintf("%s (got %s)", msg, showKey(path, raw)))
		return nil, false
	}
	return raw, true
}

func pathOrRoot(p string) string {
	if p == "" {
		return "(top level)"
	}
	return p
}

// leafWant says what a leaf of type t must look like.
func leafWant(t reflect.Type) string {
	switch {
	case t == durationType:
		return "must be a duration like 500ms, 5s or 1m"
	case t == byteSizeType:
		return "must be a size like 4MiB, 512KiB, 1GiB, 64KB or a number of bytes"
	case t == depthType:
		return "must be auto or a whole number"
	case t == spinType:
		return "must be auto, adaptive or a duration like 100us"
	}
	switch t.Kind() {
	case reflect.String:
		return "must be a string; quote it"
	case reflect.Bool:
		return "must be true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "must be an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "must be a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "must be a number"
	case reflect.Slice:
		return "must be a list of " + strings.TrimPrefix(leafWant(t.Elem()), "must be a ")
	}
	return "has the wrong type"
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Tag.Get("mapstructure") == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		if n := t.Field(i).Tag.Get("mapstructure"); n != "" && n != "-" {
			names = append(names, n)
		}
	}
	return names
}

// suggest returns the known name closest to k when it is a likely typo.
func suggest(k string, known []string) string {
	best, bestD := "", 3
	for _, n := range known {
		if d := editDistance(k, n); d < bestD {
			best, bestD = n, d
		}
	}
	if bestD > len(k)/2 {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// showKey is show, except that it hides values under security (but
// token_file and the tls files: paths) and of secret-looking keys anywhere, so a token never
// lands in an error message or a log.
func showKey(key string, v any) string {
	if key == "security.token_file" || (strings.HasPrefix(key, "security.tls.") && strings.HasSuffix(key, "_file")) {
		return show(v) // paths, not secrets
	}
	if key == "security" || strings.HasPrefix(key, "security.") {
		return "<redacted>"
	}
	for k := key; k != ""; k = parentKey(k) {
		last := strings.ToLower(k[strings.LastIndexAny(k, ".]")+1:])
		for _, s := range []string{"token", "secret", "password"} {
			if strings.Contains(last, s) {
				return "<redacted>"
			}
		}
	}
	return show(v)
}

// show writes a value for a message: strings quoted, long values cut.
func show(v any) string {
	var s string
	switch x := v.(type) {
	case nil:
		s = "null"
	case string:
		s = strconv.Quote(x)
	case time.Duration:
		s = x.String()
	case ByteSize:
		s = x.String()
	default:
		s = fmt.Sprint(x)
	}
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
