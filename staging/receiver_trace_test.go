package staging

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Scripted traces of the receive core (testdata/receiver/*.txt), in the
// manner of etcd-io/raft's datadriven files: each block is one event,
// "----", and what the core returned, one line per output, ended by a
// blank line. go test ./staging -run TestReceiverTraces -rewrite writes
// the outputs anew (read the diff before committing it).
//
// Events (T a transfer id, i/n chunk i of n):
//
//	open T total=B [timeout=D] [pull] [inline]
//	refused T [exists]
//	chunk T i/n [inline] [segerr]     a data stream's chunk header
//	check T i/n [segerr]              a ring chunk's
//	landed T i B [err]
//	damaged T i [inline]
//	release T | ring T | touch T | direct T B | fail T [nack]
//	tick +D                           the clock moves D, then a tick
//	close
//	state T                           open, gone or unknown
var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs of testdata/receiver")

func TestReceiverTraces(t *testing.T) {
	files, err := filepath.Glob("testdata/receiver/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no traces: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runTrace(t, f) })
	}
}

func runTrace(t *testing.T, file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tr := &trace{r: NewReceiver(4), now: time.Unix(1000, 0)}
	var out strings.Builder
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: %q is not followed by ----", file, i+1, line)
		}
		got, err := tr.do(line)
		if err != nil {
			t.Fatalf("%s:%d: %v", file, i+1, err)
		}
		want := []string{}
		j := i + 2
		for ; j < len(lines) && lines[j] != ""; j++ {
			want = append(want, lines[j])
		}
		if !*rewrite && strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n  %s\nwant:\n  %s", file, i+1, line, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n", line, strings.Join(got, "\n"))
		i = j - 1
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type trace struct {
	r   *Receiver
	now time.Time
}

var errSegs = errors.New("segment out of range")

// do steps the event a line describes and prints the output.
func (tr *trace) do(line string) ([]string, error) {
	f := strings.Fields(line)
	flags := map[string]string{}
	var args []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			flags[k] = v
		} else if a == "inline" || a == "pull" || a == "segerr" || a == "err" || a == "nack" || a == "exists" {
			flags[a] = ""
		} else {
			args = append(args, a)
		}
	}
	has := func(k string) bool { _, ok := flags[k]; return ok }
	num := func(i int) uint64 {
		if i >= len(args) {
			return 0
		}
		n, _ := strconv.ParseUint(args[i], 10, 64)
		return n
	}
	ev := RecvEvent{Transfer: num(0), Inline: has("inline"), Pull: has("pull"), TellPeer: has("nack")}
	if len(args) > 1 {
		if c, n, ok := strings.Cut(args[1], "/"); ok {
			ci, _ := strconv.ParseUint(c, 10, 32)
			ni, _ := strconv.ParseUint(n, 10, 32)
			ev.Chunk, ev.Count = uint32(ci), uint32(ni)
		} else {
			ev.Chunk = uint32(num(1))
		}
	}
	if has("segerr") {
		ev.Err = errSegs
	}
	switch f[0] {
	case "open":
		ev.Kind = RxOpen
		ev.Total, _ = strconv.ParseUint(flags["total"], 10, 64)
		if d, ok := flags["timeout"]; ok {
			ev.Timeout, _ = time.ParseDuration(d)
		}
	case "refused":
		ev.Kind = RxRefused
		if has("exists") {
			ev.Err = ErrExists
		} else {
			ev.Err = errors.New("refused")
		}
	case "chunk":
		ev.Kind = RxChunk
	case "check":
		ev.Kind = RxCheck
	case "landed":
		ev.Kind, ev.Bytes = RxLanded, num(2)
		if has("err") {
			ev.Err = errors.New("device error")
		}
	case "damaged":
		ev.Kind = RxDamaged
		if ev.Inline {
			ev.Err = errors.New("inline chunk damaged")
		}
	case "release":
		ev.Kind = RxRelease
	case "ring":
		ev.Kind = RxViaRing
	case "touch":
		ev.Kind = RxTouch
	case "direct":
		ev.Kind, ev.Bytes = RxDirect, num(1)
	case "fail":
		ev.Kind, ev.Err = RxFail, errors.New("failed here")
	case "tick":
		d, err := time.ParseDuration(strings.TrimPrefix(f[1], "+"))
		if err != nil {
			return nil, err
		}
		tr.now = tr.now.Add(d)
		ev = RecvEvent{Kind: RxTick}
	case "close":
		ev = RecvEvent{Kind: RxClose, Err: errors.New("session closed")}
	case "state":
		return []string{[]string{"unknown", "open", "gone"}[tr.r.State(ev.Transfer)]}, nil
	default:
		return nil, fmt.Errorf("unknown event %q", f[0])
	}
	ev.Now = tr.now
	var out RecvReady
	tr.r.Step(ev, &out)
	return printReady(&out), nil
}

func printReady(r *RecvReady) []string {
	var s []string
	if r.Hold {
		s = append(s, "hold")
	}
	if r.Err != nil {
		s = append(s, "err: "+r.Err.Error())
	}
	for _, a := range r.Acks {
		s = append(s, fmt.Sprintf("ack %d/%d", a.Transfer, a.Chunk))
	}
	if r.Credits > 0 {
		s = append(s, fmt.Sprintf("credit %d", r.Credits))
	}
	for _, a := range r.Resends {
		s = append(s, fmt.Sprintf("resend %d/%d", a.Transfer, a.Chunk))
	}
	for _, n := range r.Nacks {
		s = append(s, fmt.Sprintf("nack %d: %v", n.Transfer, n.Err))
	}
	for _, p := range r.Progress {
		s = append(s, fmt.Sprintf("progress %d %d B", p.Transfer, p.Bytes))
	}
	for _, d := range r.Done {
		line := fmt.Sprintf("done %d %d B", d.Transfer, d.Bytes)
		if d.Err != nil {
			line += ": " + d.Err.Error()
		}
		s = append(s, line)
	}
	for _, id := range r.Released {
		s = append(s, fmt.Sprintf("released %d", id))
	}
	if r.Duplicates > 0 {
		s = append(s, fmt.Sprintf("duplicates %d", r.Duplicates))
	}
	if len(s) == 0 {
		s = append(s, "-")
	}
	return s
}
