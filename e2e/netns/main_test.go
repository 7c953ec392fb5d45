package netns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// stagedBin is the sidecar under test: built once by the outer run (with
// the race detector when the tests have it), handed to the inner run in
// STAGED_BIN.
var stagedBin string

func TestMain(m *testing.M) {
	if p := os.Getenv("STAGED_BIN"); p != "" {
		stagedBin = p
		os.Exit(leakCheck(m.Run()))
	}
	dir, err := os.MkdirTemp("", "stage-netns-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stagedBin = filepath.Join(dir, "staged")
	args := []string{"build", "-C", "../..", "-o", stagedBin}
	if raceBuild {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "./cmd/staged")...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build staged: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(leakCheck(code))
}

// leakCheck fails a passing run that left goroutines behind.
func leakCheck(code int) int {
	if code != 0 {
		return code
	}
	// toxiproxy leaves goroutines of its links and toxics blocked after
	// Proxy.Stop, and those of a hung removal or addition (see toxi: the
	// proxy is replaced and the call left blocked inside toxiproxy): its
	// own leaks, in the test process only. Ignore those.
	var opts []goleak.Option
	for _, f := range []string{"/toxics.(*ToxicStub).Run", "/toxics.(*ToxicStub).InterruptToxic", ".(*ToxicLink).read", ".(*ToxicLink).write",
		".(*ToxicCollection).RemoveToxic", ".(*ToxicCollection).chainRemoveToxic", ".(*ToxicLink).RemoveToxic",
		".(*ToxicCollection).AddToxicJson", ".(*ToxicCollection).chainAddToxic", ".(*ToxicLink).AddToxic",
		"/toxics.(*ToxicStub).WriteOutput", ".(*Proxy).Stop", ".(*Proxy).server", ".(*Proxy).freeBlocker"} {
		opts = append(opts, goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2"+f))
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goroutines leaked in the test process:", err)
		return 1
	}
	return 0
}
