package proxytest_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// kvCache makes a synthetic KV cache of one layer, poisoned with
// guardByte and registered with sc; the test's cleanups unregister and
// free it (before the sidecars close).
func kvCache(t *testing.T, sc *proxytest.Sidecar, name string, p kvlayout.Params) *kvsim.KV {
	t.Helper()
	k, err := kvsim.NewKV(name, "vllm-flash", p, 1)
	if err == nil {
		t.Cleanup(func() { _ = k.Close() })
		err = errors.Join(k.Poison(guardByte), k.Register(context.Background(), sc.Client, wire.AccessAll))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for tn := range k.Layout.NumTensors() {
			if err := sc.Client.Unregister(context.Background(), k.Region(0, tn)); err != nil {
				t.Error(err)
			}
		}
	})
	return k
}

// TestKVRepeatedBlocks: the sidecar an engine submits to refuses a KV
// transfer whose destination table names one block twice among the
// blocks its tokens use (two token ranges would land in that block),
// naming the block and its positions, before anything moves; a source
// table may name a block twice, and the rows arrive as the reference
// copier moves them.
func TestKVRepeatedBlocks(t *testing.T) {
	pre, dec := proxytest.Pair(t, proxytest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := kvlayout.Params{DType: kvlayout.BF16, Blocks: 8, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	local, remote := kvCache(t, pre, "local", p), kvCache(t, dec, "remote", p)
	if err := local.Fill(11); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dir  wire.Direction
		move kvsim.KVMove
		want string // "" done
	}{
		{"push into one remote block twice", wire.Push, kvsim.KVMove{SrcTable: []uint32{0, 1}, DstTable: []uint32{5, 5}, Tokens: 20},
			"the peer's block table: kvlayout: invalid kv layout: repeated destination block: block_table[0] and block_table[1] are both block 5"},
		{"pull into one local block twice", wire.Pull, kvsim.KVMove{SrcTable: []uint32{0, 1, 2}, DstTable: []uint32{3, 4, 3}, Tokens: 40},
			"KV cache \"local\": kvlayout: invalid kv layout: repeated destination block: block_table[0] and block_table[2] are both block 3"},
		{"push from one block twice", wire.Push, kvsim.KVMove{SrcTable: []uint32{2, 2}, DstTable: []uint32{6, 7}, Tokens: 32}, ""},
		{"pull from one block twice", wire.Pull, kvsim.KVMove{SrcTable: []uint32{6, 6}, DstTable: []uint32{1, 2}, Tokens: 32}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.move.Layers = []int{0}
			src, dst := local, remote
			if tc.dir == wire.Pull {
				src, dst = remote, local
			}
			want, err := dst.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			id, err := pre.Client.SubmitKV(ctx, tc.move.Submit(proxytest.Route, "t", tc.dir, local, remote))
			if err == nil {
				var st *wire.XferStatus
				if st, err = pre.Client.Wait(ctx, id, 20*time.Second); err == nil && st.State != wire.StateDone {
					t.Fatalf("state %v, want done", st.State)
				}
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("done; want a refusal naming %q", tc.want)
			case tc.want != "" && (client.CodeOf(err) != wire.CodeBadRequest || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("refused with %v (%v); want %v naming %q", client.CodeOf(err), err, wire.CodeBadRequest, tc.want)
			}
			if tc.want == "" {
				if err := kvsim.Expect(src, dst, want, tc.move); err != nil {
					t.Fatal(err)
				}
			}
			got, err := dst.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s holds other bytes than it should after the transfer", dst.Name)
			}
		})
	}
}
