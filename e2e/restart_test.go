package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// engineEnv, set to a control socket's path, makes the test binary an
// engine (runEngine) instead of running tests.
const engineEnv = "STAGE_E2E_ENGINE_SOCKET"

// The decode engine's KV cache: one layer of vLLM's flash layout.
var (
	engineKV     = kvlayout.Params{DType: kvlayout.BF16, Blocks: 64, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 64}
	engineLayers = 2
)

const enginePoison = 0xAB

// runEngine is a decode engine in a process of its own: it registers the
// KV cache "engine-kv" (regions engine-kv/L/T) poisoned, says "ready",
// then answers "dump PATH" (its memory, written to PATH) until it is
// killed; SIGTERM ends it at once, with nothing unregistered, as an
// engine that exits without cleaning up.
func runEngine(sock string) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() { <-term; os.Exit(0) }()
	fail := func(err error) int { fmt.Println("error:", err); return 1 }
	ctx := context.Background()
	cl, err := client.Dial(sock)
	if err != nil {
		return fail(err)
	}
	k, err := kvsim.NewKV("engine-kv", "vllm-flash", engineKV, engineLayers)
	if err != nil {
		return fail(err)
	}
	if err := k.Poison(enginePoison); err != nil {
		return fail(err)
	}
	if err := k.Register(ctx, cl, wire.AccessAll); err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		path, ok := strings.CutPrefix(in.Text(), "dump ")
		if !ok {
			return fail(fmt.Errorf("unknown command %q", in.Text()))
		}
		b, err := k.Snapshot()
		if err == nil {
			err = os.WriteFile(path, b, 0o600)
		}
		if err != nil {
			return fail(err)
		}
		fmt.Println("ok")
	}
	return 0
}

// engine is a runEngine process.
type engine struct {
	cmd *exec.Cmd
	in  *os.File
	out *bufio.Scanner
}

func startEngine(t *testing.T, sock string) *engine {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), engineEnv+"="+sock)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e := &engine{cmd: cmd, in: stdin.(*os.File), out: bufio.NewScanner(stdout)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line := e.line(t); line != "ready" {
		t.Fatalf("the engine started beside the running sidecar said %q, want ready", line)
	}
	return e
}

func (e *engine) line(t *testing.T) string {
	t.Helper()
	if !e.out.Scan() {
		t.Fatalf("the engine ended: %v", e.out.Err())
	}
	return e.out.Text()
}

// dump is the engine's memory now.
func (e *engine) dump(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "engine.mem")
	if _, err := fmt.Fprintf(e.in, "dump %s\n", path); err != nil {
		t.Fatal(err)
	}
	if line := e.line(t); line != "ok" {
		t.Fatalf("dump: the engine said %q", line)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEngineRestartBesideSidecar: a decode engine killed (SIGKILL) or
// stopped (SIGTERM) without unregistering, beside its running sidecar,
// starts again, registers the same regions and KV cache at once, and KV
// moves into it again; the sidecar ends with nothing of the dead engines.
func TestEngineRestartBesideSidecar(t *testing.T) {
	pre, dec := pair(t, nodeOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	S, err := kvsim.NewKV("prefill-kv", "vllm-flash", engineKV, engineLayers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = S.Close() })
	if err := S.Fill(uint64(time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	if err := S.Register(ctx, pre.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for l := range engineLayers {
			for tn := range S.Layout.NumTensors() {
				_ = pre.cl.Unregister(context.Background(), S.Region(l, tn))
			}
		}
	})
	// The engine's layout, for the expected bytes (its memory is the engine's).
	shape, err := kvsim.NewKV("engine-kv", "vllm-flash", engineKV, engineLayers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shape.Close() })
	move := kvsim.KVMove{Layers: []int{0, 1}, SrcTable: []uint32{3, 9, 1}, DstTable: []uint32{7, 2, 40}, Tokens: 40}
	for i, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM, syscall.SIGKILL} {
		eng := startEngine(t, dec.socket)
		m := move.Submit("decode", fmt.Sprintf("restart-%d", i), wire.Push, S, shape)
		id, err := pre.cl.SubmitKV(ctx, m)
		if err != nil {
			t.Fatalf("engine %d: submit: %v", i, err)
		}
		if _, err := pre.cl.Wait(ctx, id, 30*time.Second); err != nil {
			t.Fatalf("engine %d: the KV push: %v", i, err)
		}
		want := bytes.Repeat([]byte{enginePoison}, len(eng.dump(t)))
		if err := kvsim.Expect(S, shape, want, move); err != nil {
			t.Fatal(err)
		}
		if got := eng.dump(t); !bytes.Equal(got, want) {
			t.Fatalf("engine %d: its KV cache after the push differs from the reference copy", i)
		}
		if err := eng.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		_ = eng.cmd.Wait()
		waitStats(t, dec, func(st wire.Stats) bool { return st.Regions == 0 && st.Mappings == 0 },
			fmt.Sprintf("the engine's regions released after %v", sig))
	}
}

// waitStats waits until n's stats satisfy ok.
func waitStats(t *testing.T, n *node, ok func(wire.Stats) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := n.stats()
		if ok(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s: %d regions, %d mappings\n%s", what, st.Regions, st.Mappings, n.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
