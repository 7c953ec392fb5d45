package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Encoding primitives. Every integer is little-endian and fixed-width.
//
// Encoders never fail. A field longer than its length prefix can express is
// written with the prefix's largest value and cut to it, which exceeds every
// Max* limit, so the peer rejects the frame instead of misreading the bytes
// that follow. Human-readable text (Message and Reason fields) is cut to
// MaxMessage bytes, on a UTF-8 boundary, so that an error report always fits.

var le = binary.LittleEndian

func appendU8(b []byte, v uint8) []byte   { return append(b, v) }
func appendU16(b []byte, v uint16) []byte { return le.AppendUint16(b, v) }
func appendU32(b []byte, v uint32) []byte { return le.AppendUint32(b, v) }
func appendU64(b []byte, v uint64) []byte { return le.AppendUint64(b, v) }

// appendStr appends s with a u16 length prefix.
func appendStr(b []byte, s string) []byte {
	if len(s) > math.MaxUint16 {
		s = s[:math.MaxUint16]
	}
	b = appendU16(b, uint16(len(s)))
	return append(b, s...)
}

// appendText appends human-readable text with a u16 length prefix, cut to
// MaxMessage bytes without splitting a UTF-8 sequence.
func appendText(b []byte, s string) []byte {
	if len(s) > MaxMessage {
		n := MaxMessage
		for i := 0; i < 3 && n > 0 && s[n]&0xC0 == 0x80; i++ {
			n--
		}
		s = s[:n]
	}
	return appendStr(b, s)
}

// appendBytes16 appends p with a u16 length prefix.
func appendBytes16(b, p []byte) []byte {
	if len(p) > math.MaxUint16 {
		p = p[:math.MaxUint16]
	}
	b = appendU16(b, uint16(len(p)))
	return append(b, p...)
}

// appendBytes32 appends p with a u32 length prefix.
func appendBytes32(b, p []byte) []byte {
	n := listLen(len(p))
	b = appendU32(b, uint32(n))
	return append(b, p[:n]...)
}

// listLen is the number of elements a u32 count can carry of a list of n.
func listLen(n int) int {
	if uint64(n) > math.MaxUint32 {
		return math.MaxUint32
	}
	return n
}

func appendStrs(b []byte, ss []string) []byte {
	n := listLen(len(ss))
	b = appendU32(b, uint32(n))
	for _, s := range ss[:n] {
		b = appendStr(b, s)
	}
	return b
}

// Minimum encoded sizes of list elements, used to bound a count by the bytes
// that remain before anything is allocated.
const (
	minStrSize        = 2             // u16 length, empty string
	regionInfoMinSize = 2 + 8 + 1 + 2 // name, size, access, device
	opSize            = 4 + 4 + 8 + 8 + 8
	localOpSize       = 4 + 4 + 8 + 8 + 8
)

// decodeError is what decoders return: a description naming the message,
// the field and the values, wrapping one of the Err* sentinels.
type decodeError struct {
	msg  string
	kind error
}

func (e *decodeError) Error() string {
	return e.msg + ": " + strings.TrimPrefix(e.kind.Error(), "wire: ")
}

func (e *decodeError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &decodeError{msg: "wire: " + fmt.Sprintf(format, args...), kind: kind}
}

// decoder reads a body front to back. The first failure sticks: later reads
// return zero values and do nothing, and err reports the first failure.
type decoder struct {
	b   []byte
	off int
	t   Type
	idx int // index of the list element being decoded, for error messages
	err error
}

// path names a field for an error: "Submit.Ops[3].Len". A field written
// with "[]" gets the current element index.
func (d *decoder) path(field string) string {
	if i := strings.Index(field, "[]"); i >= 0 {
		field = field[:i] + "[" + strconv.Itoa(d.idx) + "]" + field[i+2:]
	}
	if field == "" {
		return d.t.String()
	}
	return d.t.String() + "." + field
}

func (d *decoder) fail(kind error, field, format string, args ...any) {
	if d.err == nil {
		d.err = &decodeError{msg: "wire: " + d.path(field) + ": " + fmt.Sprintf(format, args...), kind: kind}
	}
}

func (d *decoder) rem() int { return len(d.b) - d.off }

// take returns the next n bytes, or nil (and a failure) when fewer remain.
func (d *decoder) take(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > d.rem() {
		d.fail(ErrMalformed, field, "need %d bytes at offset %d, have %d", n, d.off, d.rem())
		return nil
	}
	p := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u8(field string) uint8 {
	if p := d.take(field, 1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16(field string) uint16 {
	if p := d.take(field, 2); p != nil {
		return le.Uint16(p)
	}
	return 0
}

func (d *decoder) u32(field string) uint32 {
	if p := d.take(field, 4); p != nil {
		return le.Uint32(p)
	}
	return 0
}

func (d *decoder) u64(field string) uint64 {
	if p := d.take(field, 8); p != nil {
		return le.Uint64(p)
	}
	return 0
}

// array fills a fixed-size array field.
func (d *decoder) array(field string, dst []byte) {
	if p := d.take(field, len(dst)); p != nil {
		copy(dst, p)
	}
}

// len16 reads a u16 length and checks it against max and the bytes left.
func (d *decoder) len16(field string, max int) int {
	n := int(d.u16(field))
	if d.err != nil {
		return 0
	}
	if n > max {
		d.fail(ErrTooLarge, field, "length %d exceeds limit %d", n, max)
		return 0
	}
	return n
}

// str reads a string with a u16 length prefix. The string is a copy.
func (d *decoder) str(field string, max int) string {
	n := d.len16(field, max)
	if n == 0 {
		return ""
	}
	if p := d.take(field, n); p != nil {
		return string(p)
	}
	return ""
}

// bytes16 reads bytes with a u16 length prefix: a copy, nil when empty.
func (d *decoder) bytes16(field string, max int) []byte {
	n := d.len16(field, max)
	if n == 0 {
		return nil
	}
	if p := d.take(field, n); p != nil {
		return append([]byte(nil), p...)
	}
	return nil
}

// bytes32 reads bytes with a u32 length prefix: a copy, nil when empty.
func (d *decoder) bytes32(field string, max int) []byte {
	n := d.u32(field)
	if d.err != nil || n == 0 {
		return nil
	}
	if uint64(n) > uint64(max) {
		d.fail(ErrTooLarge, field, "length %d exceeds limit %d", n, max)
		return nil
	}
	if p := d.take(field, int(n)); p != nil {
		return append([]byte(nil), p...)
	}
	return nil
}

// count reads a u32 list count and checks it against max and against the
// bytes left, given the smallest encoding of one element, so that the caller
// may allocate count elements.
func (d *decoder) count(field string, max, minSize int) int {
	n := d.u32(field)
	if d.err != nil {
		return 0
	}
	if uint64(n) > uint64(max) {
		d.fail(ErrTooLarge, field, "count %d exceeds limit %d", n, max)
		return 0
	}
	if need := uint64(n) * uint64(minSize); need > uint64(d.rem()) {
		d.fail(ErrMalformed, field, "count %d needs at least %d bytes, %d remain", n, need, d.rem())
		return 0
	}
	return int(n)
}

// strs reads a list of strings, nil when empty.
func (d *decoder) strs(field string, maxCount, maxLen int) []string {
	n := d.count(field, maxCount, minStrSize)
	if n == 0 {
		return nil
	}
	ss := make([]string, n)
	elem := field + "[]"
	for i := range ss {
		d.idx = i
		ss[i] = d.str(elem, maxLen)
		if d.err != nil {
			return nil
		}
	}
	return ss
}

// finish reports the first failure, or trailing bytes.
func (d *decoder) finish() error {
	if d.err == nil && d.rem() != 0 {
		d.fail(ErrMalformed, "", "%d trailing bytes after offset %d", d.rem(), d.off)
	}
	return d.err
}

// boolean reads a u8 that must be 0 or 1.
func (d *decoder) boolean(field string) bool {
	v := d.u8(field)
	if d.err == nil && v > 1 {
		d.fail(ErrMalformed, field, "boolean byte is %d", v)
	}
	return v == 1
}

// appendBool appends b as a u8, 0 or 1.
func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}
