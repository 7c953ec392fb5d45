package kernels

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestGatherPTX checks that the committed PTX is a module of gather.cu's
// kernel, built for the target the package doc names.
func TestGatherPTX(t *testing.T) {
	if strings.TrimSpace(GatherPTX) == "" {
		t.Fatal("gather.ptx is empty: regenerate it with nvcc (see the package doc)")
	}
	for _, want := range []string{".entry " + CopyFunc + "(", ".entry " + StridedFunc + "(", ".target sm_80", ".address_size 64"} {
		if !strings.Contains(GatherPTX, want) {
			t.Errorf("gather.ptx lacks %q", want)
		}
	}
	if m := regexp.MustCompile(`\.maxntid (\d+), 1, 1`).FindAllStringSubmatch(GatherPTX, -1); len(m) != 2 || m[0][1] != "256" || m[1][1] != "256" {
		t.Errorf("gather.ptx launch bounds %v, want .maxntid 256, 1, 1 (CopyBlock) on both kernels", m)
	}
	src, err := os.ReadFile("gather.cu")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), "extern \"C\" __global__") || !strings.Contains(string(src), CopyFunc) {
		t.Error("gather.cu does not define the extern \"C\" kernel CopyFunc names")
	}
}
