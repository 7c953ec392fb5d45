package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

// benchFlags are bench's flags as given.
type benchFlags struct {
	spawn                bool
	logs                 string // --logs: keep the spawned sidecars' directory here
	stripes              int
	staged               string
	device, remoteDevice string
	slotSize             string
	slots                int
	remote               string
	size, block          string
	pattern, dir         string
	iters, warmup        int
	verify, verifyEnd    bool
	pause                time.Duration
	json, sweep, raw     bool
	rawSpan, rawPeer     string
	plot, checksum       string
	transport            string
	inflight             int
	tls                  bool
	spin                 config.Spin
	splice               bool
	kv                   string
	kvTokens, kvHeads    uint32
	kvHeadSize           uint32
	kvLayers             int
	kvGrant              bool
	profile              string
	pieces               int  // --pieces; -1: the client's default
	spliceSet, spinSet   bool // --splice, --spin given (else the sidecars' and client's defaults)
}

// register adds bench's flags to f, each writing into b.
func (b *benchFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&b.spawn, "spawn", false, "start two local sidecars (route \"bench\") and measure between them")
	f.IntVar(&b.stripes, "stripes", 4, "with --spawn: data streams between the sidecars; with --raw: TCP streams")
	f.StringVar(&b.staged, "staged", "", "with --spawn: path of the staged binary (default: beside stagectl)")
	f.StringVar(&b.logs, "logs", "", "with --spawn: keep the sidecars' configs and logs (NAME.yaml, NAME.log) in this directory, made 0700 if missing, instead of a temporary one removed at the end; with STAGE_LOG_LEVEL=debug their logs time each same-node push's steps")
	f.StringVar(&b.device, "device", "hostmem", "where the local engine memory (and with --spawn, the local sidecar's device) lives: hostmem or cuda:N")
	f.StringVar(&b.remoteDevice, "remote-device", "", "the same for the remote side (default: as --device)")
	f.StringVar(&b.slotSize, "slot-size", "4MiB", "with --spawn: staging slot size")
	f.IntVar(&b.slots, "slots", 32, "with --spawn: staging slots per sidecar")
	f.StringVar(&b.remote, "remote-socket", "", "control socket of the peer's sidecar (required without --spawn)")
	f.StringVar(&b.size, "size", "256MiB", "bytes per transfer")
	f.StringVar(&b.block, "block", "1MiB", "block size")
	f.StringVar(&b.pattern, "pattern", "ranges", "ranges | blocks")
	f.StringVar(&b.dir, "dir", "push", "push | pull")
	f.IntVar(&b.iters, "iters", 5, "transfers to time")
	f.IntVar(&b.warmup, "warmup", 1, "untimed transfers first")
	f.BoolVar(&b.verify, "verify", false, "check every byte after each transfer")
	f.BoolVar(&b.verifyEnd, "verify-end", false, "poison the destination before the timed transfers and check every byte after the last: transfers run back to back, as an engine's do, instead of with a check between each (what --inflight above 1 always does)")
	f.DurationVar(&b.pause, "pause", 0, "sit idle this long before each timed transfer (outside its time), one transfer at a time: what an engine's pauses do to a transfer without the memory traffic of --verify's check; with --verify-end the check stays at the end")
	f.BoolVar(&b.json, "json", false, "print the results as JSON")
	f.BoolVar(&b.sweep, "sweep", false, "measure block sizes 4KiB..64MiB (scattered blocks)")
	f.BoolVar(&b.raw, "raw", false, "also measure raw TCP with the same streams (the ceiling)")
	f.StringVar(&b.rawSpan, "raw-span", "4MiB", "with --raw: each raw stream cycles 4 MiB writes (and reads) over a buffer this large; 4MiB keeps it in the CPU caches, a larger one measures TCP from cold memory as stage's staging slots are")
	f.StringVar(&b.rawPeer, "raw-peer", "", "with --raw and no --spawn: address of a `stagectl sink` on the peer's host")
	f.StringVar(&b.plot, "plot", "", "with --sweep: draw throughput against block size, with the raw TCP line, into this file: PNG, or SVG, PDF, EPS, JPEG or TIFF by its extension (.svg, .pdf, ...)")
	f.StringVar(&b.checksum, "checksum", "route", "CRC32C per chunk: on, off, or route (as the route says)")
	f.StringVar(&b.transport, "transport", "tcp", "with --spawn: the route's transport; tcp measures the staging path, auto/ipc/shm the same-node paths")
	f.IntVar(&b.inflight, "inflight", 1, "transfers in flight at once, each between its own pair of buffers, as an engine pushing layer after layer keeps them; above 1, latency is per transfer and --verify checks each pair once after the timed transfers")
	f.BoolVar(&b.tls, "tls", false, "with --spawn: the sidecars talk mutual TLS (security.tls), with a throwaway CA and certificates made for the run")
	f.Var(&b.spin, "spin", "how readers poll instead of sleeping after each message, in bench's clients (client.WithSpin, WithAdaptiveSpin) and, with --spawn, in the sidecars (staging.read_spin): a duration polls that long (fixed window), 0 never polls, adaptive polls 100us widened up to 1ms to cover a steady pace (on any machine), auto is the defaults; not given: the defaults (adaptive on machines of 8+ CPUs, else never)")
	f.BoolVar(&b.splice, "splice", true, "with --spawn: whether the sidecars send chunk payloads with vmsplice+splice (staging.splice_send). Unset: their default, splice where it applies if a start-up probe finds it faster than writev on this machine (staging.splice_probe); --splice forces it on without the probe, --splice=false off; see docs/OPERATIONS.md, \"Splice send\"")
	f.StringVar(&b.kv, "kv", "", "move a synthetic KV cache from layout preset FROM (local) to TO (remote), as FROM[/BLOCK]:TO[/BLOCK] (e.g. ascend/128:vllm-hnd/16), beside the same-layout KV transfer and its byte ops, in the same run")
	f.Uint32Var(&b.kvTokens, "kv-tokens", 4096, "with --kv: tokens per transfer")
	f.IntVar(&b.kvLayers, "kv-layers", 8, "with --kv: layers per transfer")
	f.Uint32Var(&b.kvHeads, "kv-heads", 8, "with --kv: kv heads (both sides hold all)")
	f.Uint32Var(&b.kvHeadSize, "kv-head-size", 128, "with --kv: head size in elements")
	f.BoolVar(&b.kvGrant, "kv-grant", false, "with --kv: also time the same-layout transfer into a guarded cache, with a Grant before and a RevokeGrant after each (the vLLM connector's cost per request; docs/PROTOCOL.md 9.20)")
	f.IntVar(&b.pieces, "pieces", -1, "send a transfer of more ops than this in pieces (SubmitHead, SubmitMore: docs/PROTOCOL.md 9.5b), so the sidecar starts on the first while the rest arrive; 0: always one Submit; -1: the client's default (client.DefaultPieceOps)")
	f.StringVar(&b.profile, "profile", "", "with --spawn: write CPU profiles and execution traces of both sidecars over each row's timed transfers into this folder (go tool pprof, go tool trace)")
}

// benchPlan is what the flags ask for, checked: bench's run starts from it.
type benchPlan struct {
	route      string
	size       uint64 // bytes per transfer (--size); each row rounds it to its block (rowSize)
	dir        wire.Direction
	checksum   uint8 // wire.ChecksumRoute, On or Off
	ldev, rdev engineDevice
	// With --kv: the layouts to move between; no byte-range rows are run.
	kv            bool
	kvFrom, kvTo  kvPresetArg
	blocks        []uint64 // the rows' block sizes: --block, or the sweep's
	blocksPattern bool     // scattered blocks (--pattern blocks, --sweep), not ranges
	span          int      // --raw-span
}

// plan checks the flags and the ROUTE argument, naming the first bad one
// in the order bench always has; it does no I/O. --kv's and --raw-span's
// checks come last, as before, but now before --spawn starts sidecars
// rather than after (a bad value is refused without starting them).
func (b *benchFlags) plan(args []string) (benchPlan, error) {
	var p benchPlan
	sz, err := config.ParseByteSize(b.size)
	if err != nil {
		return p, fmt.Errorf("--size: %w", err)
	}
	p.size = uint64(sz)
	bl, err := config.ParseByteSize(b.block)
	if err != nil {
		return p, fmt.Errorf("--block: %w", err)
	}
	if p.dir, err = parseDir(b.dir); err != nil {
		return p, err
	}
	if p.checksum, err = parseChecksum(b.checksum); err != nil {
		return p, err
	}
	if b.inflight < 1 || b.inflight > 64 {
		return p, fmt.Errorf("--inflight must be 1 to 64 (got %d)", b.inflight)
	}
	if b.pause < 0 || b.pause > maxPause {
		return p, fmt.Errorf("--pause must be 0 to %s (got %s)", maxPause, b.pause)
	}
	if b.pause > 0 && b.inflight > 1 {
		return p, fmt.Errorf("--pause needs one transfer at a time (got --inflight %d)", b.inflight)
	}
	if b.pattern != "ranges" && b.pattern != "blocks" {
		return p, fmt.Errorf("--pattern must be ranges or blocks (got %q)", b.pattern)
	}
	if p.ldev, p.rdev, err = b.devices(); err != nil {
		return p, err
	}
	p.route = "bench"
	if len(args) == 1 {
		p.route = args[0]
	}
	if err := b.spawnOnly(args); err != nil {
		return p, err
	}
	if b.kv != "" {
		p.kv = true
		if p.kvFrom, p.kvTo, err = parseKVArg(b.kv); err != nil {
			return p, err
		}
		if b.kvTokens == 0 || b.kvLayers < 1 || b.kvHeads == 0 || b.kvHeadSize == 0 {
			return p, fmt.Errorf("--kv-tokens, --kv-layers, --kv-heads and --kv-head-size must be positive")
		}
		return p, nil
	}
	p.blocks, p.blocksPattern = []uint64{uint64(bl)}, b.pattern == "blocks"
	if b.sweep {
		p.blocks, p.blocksPattern = sweepBlocks(), true
	}
	span, err := config.ParseByteSize(b.rawSpan)
	if err != nil || span < rawPiece || span%rawPiece != 0 {
		return p, fmt.Errorf("--raw-span: want a multiple of 4MiB (got %q)", b.rawSpan)
	}
	p.span = int(span)
	return p, nil
}

// maxPause bounds --pause: longer idles show nothing more.
const maxPause = time.Minute

// parseDir reads --dir.
func parseDir(s string) (wire.Direction, error) {
	switch s {
	case "push":
		return wire.Push, nil
	case "pull":
		return wire.Pull, nil
	}
	return 0, fmt.Errorf("--dir must be push or pull (got %q)", s)
}

// parseChecksum reads --checksum.
func parseChecksum(s string) (uint8, error) {
	switch s {
	case "route":
		return wire.ChecksumRoute, nil
	case "on":
		return wire.ChecksumOn, nil
	case "off":
		return wire.ChecksumOff, nil
	}
	return 0, fmt.Errorf("--checksum must be on, off or route (got %q)", s)
}

// devices reads --device and --remote-device (default: as --device).
func (b *benchFlags) devices() (ldev, rdev engineDevice, err error) {
	if ldev, err = parseEngineDevice(b.device); err != nil {
		return ldev, rdev, fmt.Errorf("--device: %w", err)
	}
	rdev = ldev
	if b.remoteDevice != "" {
		if rdev, err = parseEngineDevice(b.remoteDevice); err != nil {
			return ldev, rdev, fmt.Errorf("--remote-device: %w", err)
		}
	}
	return ldev, rdev, nil
}

// spawnOnly refuses the flags that configure the sidecars bench starts
// without --spawn, and, without it, a run that names no route or no
// remote socket.
func (b *benchFlags) spawnOnly(args []string) error {
	if b.tls && !b.spawn {
		return fmt.Errorf("--tls needs --spawn (it configures the sidecars bench starts; for your own, set security.tls in their configs)")
	}
	if b.profile != "" && !b.spawn {
		return fmt.Errorf("--profile needs --spawn (it profiles the sidecars bench starts)")
	}
	if !b.spin.Valid() {
		return fmt.Errorf("--spin must be auto, adaptive or 0..%s (got %s)", config.MaxReadSpin, b.spin)
	}
	if b.logs != "" && !b.spawn {
		return fmt.Errorf("--logs needs --spawn (it keeps the logs of the sidecars bench starts)")
	}
	if b.spliceSet && !b.spawn {
		return fmt.Errorf("--splice needs --spawn (it configures the sidecars bench starts; for your own, set staging.splice_send in their configs)")
	}
	if b.spawn {
		return nil
	}
	if len(args) == 0 {
		return fmt.Errorf("name a ROUTE, or pass --spawn")
	}
	if b.remote == "" {
		return fmt.Errorf("--remote-socket is required: bench registers the destination buffer with the peer's sidecar (or pass --spawn)")
	}
	return nil
}

// sweepBlocks are the block sizes --sweep measures: 4KiB to 64MiB, by 4x.
func sweepBlocks() []uint64 {
	var blocks []uint64
	for b := uint64(4 << 10); b <= 64<<20; b *= 4 {
		blocks = append(blocks, b)
	}
	return blocks
}

// rowSize is what one transfer of a row moves: --size, at least one
// block, in whole blocks.
func rowSize(size, block uint64) uint64 {
	total := max(size, block)
	return total - total%block
}
