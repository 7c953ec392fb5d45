package kvlayout

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"
)

var updatePresets = flag.Bool("update-presets", false, "rewrite testdata/presets.json from Preset")

// presetCase is one preset with its params and what Preset builds, in the
// JSON form of the Python client (stage_client.layout.Layout.to_dict):
// python/tests/test_layout_packed.py builds each with kvderive.preset
// and compares, so both languages must agree on every preset.
type presetCase struct {
	Preset string         `json:"preset"`
	Params map[string]any `json:"params"`
	Layout map[string]any `json:"layout"`
	Lens   []uint64       `json:"lens"`
}

func presetJSON(t *testing.T, name string, p Params) presetCase {
	t.Helper()
	l, lens, err := Preset(name, p)
	if err != nil {
		t.Fatalf("Preset(%s, %+v): %v", name, p, err)
	}
	params := map[string]any{"dtype": p.DType.String(), "blocks": p.Blocks, "block_size": p.BlockSize}
	if !IsMLA(name) {
		params["heads"], params["head_lo"], params["head_hi"], params["head_size"] = p.Heads, p.HeadLo, p.HeadHi, p.HeadSize
	}
	parts := make([]map[string]any, len(l.Parts))
	for i, q := range l.Parts {
		parts[i] = map[string]any{"name": q.Name, "width": q.Width, "tensor": q.Tensor, "offset": q.Offset,
			"block_stride": q.BlockStride, "slot_stride": q.SlotStride, "head_stride": q.HeadStride}
	}
	lay := map[string]any{"dtype": l.DType.String(), "block_size": l.BlockSize, "blocks": l.Blocks, "heads": l.Heads,
		"head_lo": l.HeadLo, "head_hi": l.HeadHi, "parts": parts}
	return presetCase{name, params, lay, lens}
}

// TestPresetsJSON holds testdata/presets.json equal to what Preset builds
// for every preset (two head slices, two dtypes and block sizes each);
// go test ./kvlayout -run TestPresetsJSON -args -update-presets rewrites it.
func TestPresetsJSON(t *testing.T) {
	var cases []presetCase
	for _, name := range Presets() {
		for _, p := range []Params{
			{DType: F16, Blocks: 3, BlockSize: 4, Heads: 4, HeadLo: 2, HeadHi: 4, HeadSize: 8},
			{DType: BF16, Blocks: 5, BlockSize: 16, Heads: 8, HeadLo: 0, HeadHi: 3, HeadSize: 128},
		} {
			if IsMLA(name) {
				p.Heads, p.HeadLo, p.HeadHi, p.HeadSize = 0, 0, 0, 0
			}
			cases = append(cases, presetJSON(t, name, p))
		}
	}
	got, err := json.MarshalIndent(cases, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	const path = "testdata/presets.json"
	if *updatePresets {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./kvlayout -run TestPresetsJSON -args -update-presets writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what Preset builds; rerun with -update-presets and check the diff", path)
	}
}
