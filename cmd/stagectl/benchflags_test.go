package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/wire"
)

// TestBenchCmdRefuses: bench refuses each bad flag, or combination of
// flags, with an error that names it, before it dials or starts anything
// (none of these runs has a sidecar to talk to). The first bad flag is the
// one named.
func TestBenchCmdRefuses(t *testing.T) {
	const ok = "decode --remote-socket /nonexistent/r.sock --socket /nonexistent/l.sock"
	for _, tc := range []struct {
		args, want string
	}{
		{ok + " --size big", "--size: "},
		{ok + " --block 1QiB", "--block: "},
		{ok + " --dir sideways", `--dir must be push or pull (got "sideways")`},
		{ok + " --checksum maybe", `--checksum must be on, off or route (got "maybe")`},
		{ok + " --inflight 0", "--inflight must be 1 to 64 (got 0)"},
		{ok + " --inflight 65", "--inflight must be 1 to 64 (got 65)"},
		{ok + " --pause -1s", "--pause must be 0 to 1m0s (got -1s)"},
		{ok + " --pause 2m", "--pause must be 0 to 1m0s (got 2m0s)"},
		{ok + " --pause 10ms --inflight 2", "--pause needs one transfer at a time (got --inflight 2)"},
		{ok + " --pattern zigzag", `--pattern must be ranges or blocks (got "zigzag")`},
		{ok + " --device tpu:0", `--device: device "tpu:0": want hostmem or cuda:N`},
		{ok + " --remote-device cuda:x", `--remote-device: device "cuda:x": ordinal must be a number >= 0`},
		{ok + " --tls", "--tls needs --spawn"},
		{ok + " --profile /tmp/p", "--profile needs --spawn"},
		{ok + " --spin -1us", `"--spin" flag: must be auto, adaptive or a duration >= 0`},
		{ok + " --spin fast", `"--spin" flag: must be auto, adaptive or a duration like 100us`},
		{ok + " --spin 1h", "--spin must be auto, adaptive or 0..10ms (got 1h0m0s)"},
		{ok + " --splice=false", "--splice needs --spawn"},
		{ok + " --logs /tmp/l", "--logs needs --spawn"},
		{"--remote-socket /nonexistent/r.sock", "name a ROUTE, or pass --spawn"},
		{"decode", "--remote-socket is required"},
		{ok + " --kv vllm", "--kv wants FROM:TO"},
		{ok + " --kv nope:vllm", `--kv: preset "nope" unknown`},
		{ok + " --kv ascend/0:vllm", "block size \"0\" is not a positive number"},
		{ok + " --kv ascend:vllm-hnd --kv-layers 0", "--kv-tokens, --kv-layers, --kv-heads and --kv-head-size must be positive"},
		{ok + " --kv ascend:vllm-hnd --kv-heads 0", "must be positive"},
		{ok + " --raw-span 3MiB", `--raw-span: want a multiple of 4MiB (got "3MiB")`},
		{ok + " --raw-span 6MiB", "--raw-span: want a multiple of 4MiB"},
		{ok + " --raw-span lots", "--raw-span: want a multiple of 4MiB"},
		// The first bad flag in bench's order is the one named.
		{ok + " --dir up --size big", "--size: "},
		{ok + " --pattern x --checksum y", "--checksum must be"},
		{ok + " --tls --device tpu", "--device: "},
		{"--tls", "--tls needs --spawn"},
		{ok + " --kv x --raw-span 3MiB", "--kv wants FROM:TO"},
	} {
		t.Run(tc.args, func(t *testing.T) {
			root := newRoot()
			root.SetArgs(append([]string{"bench"}, strings.Fields(tc.args)...))
			err := root.ExecuteContext(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("stagectl bench %s: %v, want an error with %q", tc.args, err, tc.want)
			}
		})
	}
}

// parseBench parses a bench command line as cobra would hand it over.
func parseBench(t *testing.T, line string) (*benchFlags, []string) {
	t.Helper()
	b := &benchFlags{}
	f := pflag.NewFlagSet("bench", pflag.ContinueOnError)
	b.register(f)
	if err := f.Parse(strings.Fields(line)); err != nil {
		t.Fatal(err)
	}
	b.spliceSet, b.spinSet = f.Changed("splice"), f.Changed("spin")
	return b, f.Args()
}

// TestBenchPlan: what the flags ask for, checked, and the refusals that
// TestBenchCmdRefuses cannot reach without a staged to start (--spawn).
func TestBenchPlan(t *testing.T) {
	host, mib := engineDevice{kind: "hostmem"}, uint64(1<<20)
	sweep := []uint64{4 << 10, 16 << 10, 64 << 10, 256 << 10, mib, 4 * mib, 16 * mib, 64 * mib}
	for _, tc := range []struct {
		name, line string
		want       benchPlan
		err        string
	}{
		{"the defaults", "--spawn",
			benchPlan{route: "bench", size: 256 * mib, dir: wire.Push, checksum: wire.ChecksumRoute, ldev: host, rdev: host,
				blocks: []uint64{mib}, span: 4 << 20}, ""},
		{"a route of the caller's", "decode --remote-socket /r.sock --dir pull --checksum off --pattern blocks --block 64KiB --size 1GiB --device cuda:1 --remote-device hostmem --raw-span 16MiB",
			benchPlan{route: "decode", size: 1 << 30, dir: wire.Pull, checksum: wire.ChecksumOff, ldev: engineDevice{"cuda", 1}, rdev: host,
				blocks: []uint64{64 << 10}, blocksPattern: true, span: 16 << 20}, ""},
		{"the remote device as the local one", "--spawn --device cuda:2 --checksum on",
			benchPlan{route: "bench", size: 256 * mib, dir: wire.Push, checksum: wire.ChecksumOn, ldev: engineDevice{"cuda", 2}, rdev: engineDevice{"cuda", 2},
				blocks: []uint64{mib}, span: 4 << 20}, ""},
		{"a sweep scatters blocks", "--spawn --sweep --pattern ranges --block 2MiB",
			benchPlan{route: "bench", size: 256 * mib, dir: wire.Push, checksum: wire.ChecksumRoute, ldev: host, rdev: host,
				blocks: sweep, blocksPattern: true, span: 4 << 20}, ""},
		{"kv leaves --raw-span alone", "--spawn --kv ascend:vllm-hnd/32 --raw-span 3MiB",
			benchPlan{route: "bench", size: 256 * mib, dir: wire.Push, checksum: wire.ChecksumRoute, ldev: host, rdev: host,
				kv: true, kvFrom: kvPresetArg{"ascend", 128}, kvTo: kvPresetArg{"vllm-hnd", 32}}, ""},
		{"the sidecars' flags with --spawn", "--spawn --tls --profile /tmp/p --splice=false --spin 50us",
			benchPlan{route: "bench", size: 256 * mib, dir: wire.Push, checksum: wire.ChecksumRoute, ldev: host, rdev: host,
				blocks: []uint64{mib}, span: 4 << 20}, ""},
		{"a bad --kv with --spawn", "--spawn --kv ascend", benchPlan{}, "--kv wants FROM:TO"},
		{"no kv tokens with --spawn", "--spawn --kv ascend:vllm-hnd --kv-tokens 0", benchPlan{}, "must be positive"},
		{"a bad --raw-span with --spawn", "--spawn --raw-span 5MiB", benchPlan{}, "--raw-span: want a multiple of 4MiB"},
		{"--spin too long with --spawn", "--spawn --spin 2s", benchPlan{}, "--spin must be auto, adaptive or 0.."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, args := parseBench(t, tc.line)
			got, err := b.plan(args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("plan: %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestRowSize: a row moves --size in whole blocks, and at least one.
func TestRowSize(t *testing.T) {
	for _, tc := range []struct{ size, block, want uint64 }{
		{256 << 20, 1 << 20, 256 << 20},
		{10000, 4096, 8192},
		{1000, 4096, 4096},
		{0, 4096, 4096},
		{64 << 20, 64 << 20, 64 << 20},
	} {
		if got := rowSize(tc.size, tc.block); got != tc.want {
			t.Errorf("rowSize(%d, %d) = %d, want %d", tc.size, tc.block, got, tc.want)
		}
	}
}

// TestPlotTitle: the figure says what ran, where and when.
func TestPlotTitle(t *testing.T) {
	day := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		dir     wire.Direction
		stripes int
		size    uint64
		want    string
	}{
		{wire.Push, 4, 256 << 20, "stage push, 4 streams, 256MiB per transfer, box, 2026-11-28"},
		{wire.Pull, 1, 1 << 30, "stage pull, 1 streams, 1GiB per transfer, box, 2026-11-28"},
	} {
		if got := plotTitle(tc.dir, tc.stripes, tc.size, "box", day); got != tc.want {
			t.Errorf("plotTitle = %q, want %q", got, tc.want)
		}
	}
}

// TestWriteBenchReport: --json writes the rows and the ceiling as a
// BenchReport (no raw_tcp when none was measured); else the table.
func TestWriteBenchReport(t *testing.T) {
	row := &BenchResult{Route: "bench", Dir: "push", Pattern: "ranges", Size: 1 << 20, Block: 1 << 20, Iters: 2, GBps: 1.5, Devices: "hostmem:0 -> hostmem:0"}
	raw := &RawResult{Streams: 4, Span: 4 << 20, GBps: 3, Runs: 1, MinGBps: 3, MaxGBps: 3}
	for _, tc := range []struct {
		name    string
		asJSON  bool
		ceiling *RawResult
		check   func(string) bool
	}{
		{"table of one row", false, nil, func(out string) bool { return out == row.String()+"\n" }},
		{"table with the ceiling", false, raw, func(out string) bool {
			return strings.Contains(out, "50%") && strings.Contains(out, "raw TCP, 4 streams, same run: 3.000 GB/s")
		}},
		{"json", true, raw, func(out string) bool {
			var r BenchReport
			return json.Unmarshal([]byte(out), &r) == nil && reflect.DeepEqual(r, BenchReport{Results: []*BenchResult{row}, Raw: raw})
		}},
		{"json without the ceiling", true, nil, func(out string) bool {
			var r BenchReport
			return !strings.Contains(out, "raw_tcp") && json.Unmarshal([]byte(out), &r) == nil && reflect.DeepEqual(r, BenchReport{Results: []*BenchResult{row}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeBenchReport(&b, tc.asJSON, []*BenchResult{row}, tc.ceiling); err != nil {
				t.Fatal(err)
			}
			if !tc.check(b.String()) {
				t.Errorf("wrote:\n%s", b.String())
			}
		})
	}
}

// TestBenchSpin: --spin reaches the sidecars bench starts as
// staging.read_spin (STAGE_STAGING_READ_SPIN, read back as the sidecars
// read it) and bench's clients as the same policy: a fixed window, none,
// the adaptive one, or the defaults.
func TestBenchSpin(t *testing.T) {
	for _, tc := range []struct {
		arg     string
		want    config.Spin
		policy  spin.Policy
		setsEnv bool
	}{
		{"", config.SpinAuto, spin.DefaultPolicy(), false},
		{"--spin 100us", config.Spin(100 * time.Microsecond), spin.Fixed(100 * time.Microsecond), true},
		{"--spin 0", 0, spin.Policy{}, true},
		{"--spin adaptive", config.SpinAdaptive, spin.Auto(), true},
		{"--spin auto", config.SpinAuto, spin.DefaultPolicy(), true},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			t.Setenv("STAGE_STAGING_READ_SPIN", "")
			_ = os.Unsetenv("STAGE_STAGING_READ_SPIN")
			b, _ := parseBench(t, "--spawn "+tc.arg)
			if err := b.setEnv(); err != nil {
				t.Fatal(err)
			}
			env, set := os.LookupEnv("STAGE_STAGING_READ_SPIN")
			if set != tc.setsEnv {
				t.Fatalf("STAGE_STAGING_READ_SPIN set: %v (%q), want %v", set, env, tc.setsEnv)
			}
			if !b.spinSet {
				if tc.policy != spin.DefaultPolicy() {
					t.Fatal("unset --spin must leave the defaults")
				}
				return
			}
			got, err := config.ParseSpin(env)
			if err != nil || got != tc.want {
				t.Fatalf("the sidecars read %q as %v, %v; want %v", env, got, err, tc.want)
			}
			if p := b.spin.Resolve(); p != tc.policy {
				t.Fatalf("the clients poll %s, want %s", p, tc.policy)
			}
		})
	}
}

func TestSpawnDir(t *testing.T) {
	// No --logs: a temporary directory, not kept.
	tmp, keep, err := spawnDir("")
	if err != nil || keep {
		t.Fatalf("spawnDir(\"\") = %q, %v, %v; want a temporary directory, not kept", tmp, keep, err)
	}
	os.RemoveAll(tmp)

	base := t.TempDir()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, err string
	}{
		{"made", filepath.Join(base, "a", "b"), ""},
		{"existing, made private", open, ""},
		{"a file", file, "--logs " + file},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, keep, err := spawnDir(tc.dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("spawnDir(%s) = %v, want an error with %q", tc.dir, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.dir || !keep {
				t.Fatalf("spawnDir(%s) = %q, %v, %v; want it kept", tc.dir, got, keep, err)
			}
			fi, err := os.Stat(got)
			if err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("%s: %v, %v; want a 0700 directory", got, fi.Mode(), err)
			}
		})
	}
}
