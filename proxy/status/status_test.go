package status

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stage-kv/stage/wire"
)

func TestCode(t *testing.T) {
	inner := Errorf(wire.CodeDevice, "import: %w", io.ErrUnexpectedEOF)
	for _, tc := range []struct {
		name string
		err  error
		want wire.Code
	}{
		{"nil", nil, wire.CodeInternal},
		{"plain", errors.New("x"), wire.CodeInternal},
		{"coded", Errorf(wire.CodeTimeout, "late"), wire.CodeTimeout},
		{"wrapped by fmt", fmt.Errorf("register: %w", inner), wire.CodeDevice},
		{"outer code wins", Errorf(wire.CodeOutOfRange, "op 3: %w", inner), wire.CodeOutOfRange},
		{"folded with %v", fmt.Errorf("register: %v", inner), wire.CodeInternal},
	} {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("%s: Code = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestErrorfWraps(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		target error
		is     bool
		msg    string
	}{
		{"one %w", Errorf(wire.CodeDevice, "copy: %w", io.EOF), io.EOF, true, "copy: EOF"},
		{"two %w", Errorf(wire.CodeDevice, "%w and %w", io.EOF, io.ErrClosedPipe), io.ErrClosedPipe, true, "EOF and io: read/write on closed pipe"},
		{"%v folds", Errorf(wire.CodeDevice, "copy: %v", io.EOF), io.EOF, false, "copy: EOF"},
		{"deep", Errorf(wire.CodeBadRequest, "a: %w", fmt.Errorf("b: %w", Errorf(wire.CodeDevice, "c: %w", io.EOF))), io.EOF, true, "a: b: c: EOF"},
	} {
		if got := errors.Is(tc.err, tc.target); got != tc.is {
			t.Errorf("%s: errors.Is = %v, want %v", tc.name, got, tc.is)
		}
		if tc.err.Error() != tc.msg {
			t.Errorf("%s: message %q, want %q", tc.name, tc.err.Error(), tc.msg)
		}
	}
	if errors.Unwrap(Errorf(wire.CodeDevice, "plain")) != nil {
		t.Error("an error without %w unwraps to something")
	}
}
