package acl

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
)

// The cross-process harness: the test process is the engine; a child
// re-executed from the test binary (TestChildHelper) is the sidecar. The
// parent sends one request per message on a SOCK_SEQPACKET pair, the
// child's end at fd 3, and the child answers each with "ok", "err TEXT"
// or what the request asks for:
//
//	import HEX SIZE SEED OFF    import the VMM handle, gather its SIZE bytes
//	                            and compare them with RandBytes(SEED)[OFF:],
//	                            then scatter RandBytes(SEED^1) over its
//	                            first bytes (kept open until close)
//	key KEY KEY2 OFF SIZE SEED  import KEY (an export key of SIZE B), move
//	                            bytes through its view at OFF and close it;
//	                            KEY2 must be refused (keyChildWork)
//	close                       close every open mapping, newest first
//	count                       "maps M chunks C mappings N live L"
//	mode                        the device's copy mode
//
// The child opens the device its environment names (library, ordinal,
// copy mode) and closes it when the parent closes its end.

const (
	childEnv        = "STAGE_ACL_TEST_CHILD"
	childOrdinalEnv = "STAGE_ACL_TEST_CHILD_ORDINAL"
	childModeEnv    = "STAGE_ACL_TEST_CHILD_COPY_MODE"
	childFD         = 3
)

// child is a running TestChildHelper and the parent's end of its socket.
type child struct {
	t    *testing.T
	end  *os.File
	cmd  *exec.Cmd
	out  bytes.Buffer
	done bool
}

// startChild starts the child over library so on device ordinal, in copy
// mode mode ("" auto), with env added to its environment. The test's
// cleanup kills a child that finish did not end.
func startChild(t *testing.T, so string, ordinal int, mode CopyMode, env ...string) *child {
	t.Helper()
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, end: os.NewFile(uintptr(pair[0]), "parent")}
	childEnd := os.NewFile(uintptr(pair[1]), "child")
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestChildHelper$", "-test.v", "-test.count=1")
	c.cmd.Env = append(append(os.Environ(), childEnv+"=1", testLibraryEnv+"="+so,
		childOrdinalEnv+"="+strconv.Itoa(ordinal), childModeEnv+"="+string(mode)), env...)
	c.cmd.ExtraFiles = []*os.File{childEnd}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childEnd.Close()
	t.Cleanup(func() {
		c.end.Close()
		if !c.done {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	return c
}

func (c *child) pid() int32 { return int32(c.cmd.Process.Pid) }

// ask sends req and returns the child's answer.
func (c *child) ask(req string) string {
	c.t.Helper()
	if _, err := c.end.Write([]byte(req)); err != nil {
		c.t.Fatalf("to child: %v\n%s", err, c.out.String())
	}
	buf := make([]byte, 8192)
	c.end.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, err := c.end.Read(buf)
	if err != nil {
		c.t.Fatalf("child's answer to %.40q: %v\n%s", req, err, c.out.String())
	}
	return string(buf[:n])
}

// importReq asks the child to import the VMM handle h ("import").
func (c *child) importReq(h device.Handle, seed, off uint64) string {
	return c.ask(fmt.Sprintf("import %s %d %d %d", hex.EncodeToString(h.Bytes), h.Size, seed, off))
}

// finish ends the child and checks it exited cleanly (its device closed
// with nothing left open).
func (c *child) finish() {
	c.t.Helper()
	c.end.Close()
	err := c.cmd.Wait()
	c.done = true
	if err != nil {
		c.t.Fatalf("child: %v\n%s", err, c.out.String())
	}
}

// TestChildHelper is the child of the cross-process tests; it skips unless
// started by one.
func TestChildHelper(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("helper process of the cross-process tests")
	}
	ordinal, _ := strconv.Atoi(os.Getenv(childOrdinalEnv))
	d, err := OpenDevice(ordinal, Config{Library: os.Getenv(testLibraryEnv), CopyMode: CopyMode(os.Getenv(childModeEnv)), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var open []device.Mapping
	defer func() {
		for i := len(open) - 1; i >= 0; i-- {
			open[i].Close()
		}
		if err := d.Close(); err != nil {
			t.Errorf("child Close: %v", err)
		}
	}()
	buf := make([]byte, 1<<17)
	for {
		n, err := syscall.Read(childFD, buf)
		if err != nil || n == 0 {
			return
		}
		reply := childAnswer(d, &open, strings.Fields(string(buf[:n])))
		if _, err := syscall.Write(childFD, []byte(reply)); err != nil {
			t.Fatal(err)
		}
	}
}

// childAnswer performs one request f; open holds the mappings kept open.
func childAnswer(d *Device, open *[]device.Mapping, f []string) string {
	errReply := func(err error) string {
		if err != nil {
			return "err " + err.Error()
		}
		return "ok"
	}
	if len(f) == 0 {
		return "err empty request"
	}
	switch f[0] {
	case "import":
		m, err := vmmChildImport(d, f[1:])
		if err == nil {
			*open = append(*open, m)
		}
		return errReply(err)
	case "key":
		if len(f) != 6 {
			return fmt.Sprintf("err key wants 5 arguments, got %d", len(f)-1)
		}
		off, _ := strconv.ParseUint(f[3], 10, 64)
		size, _ := strconv.ParseUint(f[4], 10, 64)
		seed, _ := strconv.ParseUint(f[5], 10, 64)
		return errReply(keyChildWork(d, f[1], f[2], off, size, seed))
	case "close":
		var err error
		for i := len(*open) - 1; i >= 0; i-- {
			if cerr := (*open)[i].Close(); cerr != nil {
				err = cerr
			}
		}
		*open = nil
		return errReply(err)
	case "count":
		maps, _ := d.lib.Call("fakeacl_vmm_maps")
		live, _ := d.lib.Call("fakeacl_live")
		d.vmmMu.Lock()
		chunks := len(d.chunks)
		d.vmmMu.Unlock()
		d.core.Mu.Lock()
		mappings := d.core.Mappings
		d.core.Mu.Unlock()
		return fmt.Sprintf("maps %d chunks %d mappings %d live %d", maps, chunks, mappings, live)
	case "mode":
		mode, _ := d.CopyMode()
		return string(mode)
	}
	return fmt.Sprintf("err unknown request %q", f[0])
}
