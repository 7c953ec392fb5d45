package e2etest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BinEnv names a prebuilt staged for tests on machines without Go (the
// GPU machine runs test binaries built elsewhere).
const BinEnv = "STAGED_BIN"

// stagedPkg is the package Build builds.
const stagedPkg = "github.com/stage-kv/stage/cmd/staged"

// Build builds staged from this module into dir (race-enabled when race
// is set: tests built with -race want sidecars that are too) and returns
// its path.
func Build(dir string, race bool) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build staged: %w", err)
	}
	bin := filepath.Join(dir, "staged")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	out, err := exec.Command(goBin, append(args, stagedPkg)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build staged: %w\n%s", err, out)
	}
	return bin, nil
}

// Binary returns $STAGED_BIN when it is set, else a staged built into a
// new temporary directory, which cleanup removes.
func Binary(race bool) (bin string, cleanup func(), err error) {
	if p := os.Getenv(BinEnv); p != "" {
		return p, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "stage-staged-")
	if err != nil {
		return "", nil, fmt.Errorf("build staged: %w", err)
	}
	cleanup = func() { os.RemoveAll(dir) }
	if bin, err = Build(dir, race); err != nil {
		cleanup()
		return "", nil, err
	}
	return bin, cleanup, nil
}
