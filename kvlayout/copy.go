package kvlayout

import "fmt"

// Gather copies bytes [off, off+len(dst)) of s's canonical stream out of
// the side's tensors into dst. tensors is indexed by region (the values of
// SideSpec.Regions). It is the reference for the device kernels and the
// copier of hostmem.
func Gather(s *Side, tensors [][]byte, off uint64, dst []byte) error {
	return move(s, tensors, off, dst, true)
}

// Scatter copies src, bytes [off, off+len(src)) of s's canonical stream,
// into the side's tensors.
func Scatter(s *Side, tensors [][]byte, off uint64, src []byte) error {
	return move(s, tensors, off, src, false)
}

func move(s *Side, tensors [][]byte, off uint64, buf []byte, gather bool) error {
	what := "scatter"
	if gather {
		what = "gather"
	}
	n := uint64(len(buf))
	if off > s.total || n > s.total-off {
		return fmt.Errorf("kvlayout: %s [%d, +%d): outside the transfer's %d bytes", what, off, n, s.total)
	}
	var err error
	s.Segments(off, n, func(layer, region int, toff uint64, length uint32, wire uint64) {
		if err != nil {
			return
		}
		l := uint64(length)
		if region >= len(tensors) {
			err = fmt.Errorf("kvlayout: %s layer %d: region %d, but %d tensors given", what, layer, region, len(tensors))
			return
		}
		t := tensors[region]
		if toff > uint64(len(t)) || l > uint64(len(t))-toff {
			err = fmt.Errorf("kvlayout: %s layer %d: [%d, +%d) outside region %d's %d bytes", what, layer, toff, l, region, len(t))
			return
		}
		w := wire - off
		if gather {
			copy(buf[w:w+l], t[toff:toff+l])
		} else {
			copy(t[toff:toff+l], buf[w:w+l])
		}
	})
	return err
}
