// Package status is the sidecar's error with a wire code: every answer an
// engine or a peer gets (Fail, Nack, ShmLanded) carries the code of the
// error that ended the request and its message.
//
// An Error wraps its cause the way fmt.Errorf does (%w), so a caller can
// still ask errors.Is(err, device.ErrOutOfMemory) after the sidecar added
// what it was doing, in the manner of gRPC's status package.
package status

import (
	"errors"
	"fmt"

	"github.com/stage-kv/stage/wire"
)

// Error is an error with a wire code.
type Error struct {
	code  wire.Code
	msg   string
	cause error // what %w wrapped; nil when nothing was
}

// Errorf formats like fmt.Errorf, %w included, and gives the error code c.
func Errorf(c wire.Code, format string, args ...any) error {
	fe := fmt.Errorf(format, args...)
	e := &Error{code: c, msg: fe.Error()}
	switch u := fe.(type) {
	case interface{ Unwrap() error }:
		e.cause = u.Unwrap()
	case interface{ Unwrap() []error }:
		e.cause = fe // several %w: fmt's error keeps them all reachable
	}
	return e
}

func (e *Error) Error() string { return e.msg }

// Code is the wire code the error answers with.
func (e *Error) Code() wire.Code { return e.code }

// Unwrap is the error wrapped with %w, if any.
func (e *Error) Unwrap() error { return e.cause }

// Code returns the code of the outermost Error in err's chain: the one
// added last, which knows best what failed. An error without one (nil
// included) is CodeInternal.
func Code(err error) wire.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.code
	}
	return wire.CodeInternal
}
