package proxy

import (
	"errors"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// codeErr and errCode are this package's short names for the coded error
// of package status (every answer's Fail carries one).
func codeErr(c wire.Code, format string, args ...any) error {
	return status.Errorf(c, format, args...)
}

func errCode(err error) wire.Code { return status.Code(err) }

var (
	errChunkOnControl = errors.New("chunk or inline frame on a control session (they belong on data streams)")
	errPeerClosed     = errors.New("peer closed the connection")
)
