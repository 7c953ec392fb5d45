package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"
)

// readyLine is the one line staged writes on stdout (docs/OPERATIONS.md).
var readyLine = regexp.MustCompile(`^staged ready peers=\S+ socket=\S+( metrics=\S+)?( pprof=\S+)?\n$`)

// TestStdoutReadyLineOnly runs staged from start to a clean stop and
// requires its stdout to be the ready line and nothing else: a
// supervisor takes the first line it reads for it. gnet once wrote its
// start-up line there first.
func TestStdoutReadyLineOnly(t *testing.T) {
	dir := t.TempDir()
	cfg := fmt.Sprintf("node:\n  name: out\n  host_id: e2e-out\n  socket_dir: %s\nlisten: 127.0.0.1:0\ncontrol_socket: %s\n"+
		"metrics:\n  listen: 127.0.0.1:0\nstaging:\n  slot_size: 1MiB\n  slots: 4\n  window: 2\n"+
		"routes:\n  - name: nowhere\n    peers: [\"127.0.0.1:1\"]\n    connect_timeout: 1s\n",
		filepath.Join(dir, "node"), filepath.Join(dir, "s", "out.sock"))
	path := filepath.Join(dir, "out.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(stagedBin, "--config", path)
	cmd.Env = append(os.Environ(), "STAGE_SECURITY_TOKEN=e2e-token")
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first, rest := make(chan string, 1), make(chan []byte, 1)
	go func() {
		br := bufio.NewReader(out)
		line, _ := br.ReadString('\n')
		first <- line
		b, _ := io.ReadAll(br)
		rest <- b
	}()
	var stdout string
	select {
	case stdout = <-first:
		if stdout == "" {
			<-rest
			t.Fatalf("staged closed stdout without a line (%v); stderr:\n%s", cmd.Wait(), stderr.String())
		}
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-rest
		_ = cmd.Wait()
		t.Fatalf("staged wrote no line on stdout in 15s; stderr:\n%s", stderr.String())
	}
	time.Sleep(300 * time.Millisecond) // the route dials and fails meanwhile
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-rest:
		stdout += string(b)
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-rest
		_ = cmd.Wait()
		t.Fatal("staged did not stop within 15s of SIGTERM")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("staged exited with %v; stderr:\n%s", err, stderr.String())
	}
	if !readyLine.MatchString(stdout) {
		t.Errorf("stdout is %q, want exactly one ready line matching %s", stdout, readyLine)
	}
}
