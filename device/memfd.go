package device

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// SealHowTo tells an engine how to make a memfd a sidecar accepts.
const SealHowTo = "create it with memfd_create(name, MFD_CLOEXEC|MFD_ALLOW_SEALING), size it with ftruncate, " +
	"then seal it with fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK|F_SEAL_GROW) " +
	"(Python: os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING); " +
	"fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)); " +
	"the stage clients' own memfds are sealed so"

// CheckNoShrink refuses shared memory whose owner could still shrink it:
// fd must carry F_SEAL_SHRINK (read with F_GET_SEALS). A mapping of a file
// that is truncated under it faults (SIGBUS) on the next access, so memory
// another process hands over is mapped only once it can no longer shrink.
// The error wraps ErrBadHandle and says how to seal.
func CheckNoShrink(fd int) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	switch {
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("fd %d cannot be sealed (not a memfd or shmem file; fcntl F_GET_SEALS: EINVAL), so it could be truncated under the sidecar's copies; %s: %w", fd, SealHowTo, ErrBadHandle)
	case err != nil:
		return fmt.Errorf("fd %d: fcntl F_GET_SEALS: %w", fd, err)
	case seals&unix.F_SEAL_SHRINK == 0:
		return fmt.Errorf("memfd (fd %d) is not sealed against shrinking (seals %#x lack F_SEAL_SHRINK), so it could be truncated under the sidecar's copies; %s: %w", fd, seals, SealHowTo, ErrBadHandle)
	}
	return nil
}
