package wire

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// castagnoli is the CRC32C table; crc32 uses the CPU's instruction for it
// where there is one.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// knownFlags are the header flags this build understands.
const knownFlags = FlagCRC | FlagFD | FlagInline

// knownTypes[t] says whether t is a frame type (one of typeNames), without
// a map lookup on the chunk path.
var knownTypes = func() (k [256]bool) {
	for t := range typeNames {
		k[t] = true
	}
	return k
}()

// isLocal reports whether t is a local control-socket frame type.
func isLocal(t Type) bool { return t >= 128 }

// AppendHeader appends the 16-byte encoding of h.
func AppendHeader(dst []byte, h Header) []byte {
	dst = append(dst, Magic0, Magic1, h.Version, uint8(h.Type))
	dst = appendU16(dst, uint16(h.Flags))
	dst = appendU16(dst, 0)
	dst = appendU32(dst, h.Length)
	return appendU32(dst, h.CRC)
}

// ParseHeader decodes and checks a header: magic, version in
// [VersionMin, VersionMax], known type, reserved zero, Length within the
// type's limit (MaxChunkBody for chunks, MaxControlBody otherwise).
//
// It reads the first HeaderSize bytes of b. It also rejects unknown flag
// bits, FlagFD on anything but a local control-socket frame, a non-zero CRC
// field without FlagCRC, and a chunk body shorter than ChunkFixedSize. On
// error the Header is zero.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, errorf(ErrMalformed, "header: %d bytes, need %d", len(b), HeaderSize)
	}
	if b[0] != Magic0 || b[1] != Magic1 {
		return Header{}, errorf(ErrBadMagic, "header: magic %#02x %#02x, want %#02x %#02x ('S' 'G')", b[0], b[1], Magic0, Magic1)
	}
	h := Header{
		Version: b[2],
		Type:    Type(b[3]),
		Flags:   Flags(le.Uint16(b[4:])),
		Length:  le.Uint32(b[8:]),
		CRC:     le.Uint32(b[12:]),
	}
	if h.Version < VersionMin || h.Version > VersionMax {
		return Header{}, errorf(ErrBadVersion, "header: version %d, this build speaks %d to %d", h.Version, VersionMin, VersionMax)
	}
	if !knownTypes[h.Type] {
		return Header{}, errorf(ErrUnknownType, "header: type %d", uint8(h.Type))
	}
	if r := le.Uint16(b[6:]); r != 0 {
		return Header{}, errorf(ErrMalformed, "header: %s: reserved field %#04x, want 0", h.Type, r)
	}
	if u := h.Flags &^ knownFlags; u != 0 {
		return Header{}, errorf(ErrMalformed, "header: %s: unknown flags %#04x", h.Type, uint16(u))
	}
	if h.Flags&FlagFD != 0 && !isLocal(h.Type) {
		return Header{}, errorf(ErrMalformed, "header: %s: FlagFD on a peer frame", h.Type)
	}
	if h.Flags&FlagInline != 0 && h.Type != TypeAnnounce && h.Type != TypeChunk {
		return Header{}, errorf(ErrMalformed, "header: %s: FlagInline is only for Announce and Chunk", h.Type)
	}
	if h.Flags&FlagCRC == 0 && h.CRC != 0 {
		return Header{}, errorf(ErrMalformed, "header: %s: CRC field %#08x without FlagCRC", h.Type, h.CRC)
	}
	if h.Type == TypeChunk {
		if h.Length > MaxChunkBody {
			return Header{}, errorf(ErrTooLarge, "header: Chunk: length %d exceeds limit %d", h.Length, MaxChunkBody)
		}
		if h.Length < ChunkFixedSize {
			return Header{}, errorf(ErrMalformed, "header: Chunk: length %d below the fixed part's %d", h.Length, ChunkFixedSize)
		}
	} else if h.Length > MaxControlBody {
		return Header{}, errorf(ErrTooLarge, "header: %s: length %d exceeds limit %d", h.Type, h.Length, MaxControlBody)
	}
	return h, nil
}

// AppendFrame appends header + body of m; with crc the header carries the
// body's CRC32C and FlagCRC. extra flags (FlagFD) are ORed in.
//
// The header carries VersionMax. FlagCRC in extra counts as crc. AppendFrame
// allocates nothing when dst has room for the frame.
func AppendFrame(dst []byte, m Msg, crc bool, extra Flags) []byte {
	flags := extra
	if crc {
		flags |= FlagCRC
	}
	start := len(dst)
	dst = AppendHeader(dst, Header{Version: VersionMax, Type: m.Type(), Flags: flags})
	dst = m.AppendBody(dst)
	body := dst[start+HeaderSize:]
	le.PutUint32(dst[start+8:], uint32(len(body)))
	if flags&FlagCRC != 0 {
		le.PutUint32(dst[start+12:], crc32.Checksum(body, castagnoli))
	}
	return dst
}

// Decode decodes the body of a non-chunk frame of type t. It checks every
// length against the remaining bytes and the Max* limits before allocating,
// rejects trailing bytes, and never panics.
//
// The result is a pointer to the message struct (*Hello, *Submit, ...). It
// shares no memory with body: strings and byte slices are copies, and empty
// lists and byte slices are nil. On error the Msg is nil and the error wraps
// ErrMalformed, ErrTooLarge or ErrUnknownType.
func Decode(t Type, body []byte) (Msg, error) {
	if len(body) > MaxControlBody {
		return nil, errorf(ErrTooLarge, "%s: body of %d bytes exceeds limit %d", t, len(body), MaxControlBody)
	}
	d := decoder{b: body, t: t}
	m := decodeMsg(t, &d)
	if m == nil {
		if t == TypeChunk {
			return nil, errorf(ErrUnknownType, "Decode: Chunk frames are not decoded by Decode; use DecodeChunkFixed and DecodeChunkSegs")
		}
		return nil, errorf(ErrUnknownType, "Decode: type %d", uint8(t))
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeMsg allocates the message of type t and decodes d's body into it;
// nil when Decode has no message for t. The calls are direct, so that the
// decoder stays on the caller's stack.
func decodeMsg(t Type, d *decoder) Msg {
	if isLocal(t) {
		return decodeLocalMsg(t, d)
	}
	return decodePeerMsg(t, d)
}

// VerifyCRC checks h.CRC against body when h has FlagCRC.
//
// body must be the whole body (h.Length bytes); for a chunk that is meta and
// payload, as ChunkCRC computes it. Without FlagCRC it only checks the length.
func VerifyCRC(h Header, body []byte) error {
	if uint64(len(body)) != uint64(h.Length) {
		return errorf(ErrMalformed, "%s: body of %d bytes, header says %d", h.Type, len(body), h.Length)
	}
	if h.Flags&FlagCRC == 0 {
		return nil
	}
	if got := crc32.Checksum(body, castagnoli); got != h.CRC {
		return errorf(ErrChecksum, "%s: body CRC32C %08x, header says %08x", h.Type, got, h.CRC)
	}
	return nil
}

// readGrowStep bounds how far ReadFrame grows its buffer ahead of the bytes
// that actually arrived, so that a header claiming a large body costs memory
// only as the body arrives.
const readGrowStep = 64 << 10

// ReadFrame reads one whole non-chunk frame from r into buf (grown when too
// small, up to MaxControlBody) and decodes it.
//
// It returns the header, the message and the buffer to pass to the next call;
// the buffer holds the raw frame (header and body) until then. The message
// shares no memory with the buffer. At a clean end of stream (no byte of a
// new header) the error is io.EOF itself; a stream that ends inside a frame
// gives an error wrapping io.ErrUnexpectedEOF. A chunk frame is refused
// after its header, before any of its body is read. On error the Msg is nil;
// the Header is the frame's when its header was valid, else zero.
func ReadFrame(r io.Reader, buf []byte) (Header, Msg, []byte, error) {
	if cap(buf) < HeaderSize {
		buf = make([]byte, HeaderSize, 512)
	}
	buf = buf[:HeaderSize]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			return Header{}, nil, buf[:0], io.EOF
		}
		return Header{}, nil, buf[:0], fmt.Errorf("wire: read header: %w", err)
	}
	h, err := ParseHeader(buf)
	if err != nil {
		return Header{}, nil, buf, err
	}
	if h.Type == TypeChunk {
		return h, nil, buf, errorf(ErrUnknownType, "ReadFrame: Chunk frame; chunks are read with DecodeChunkFixed and DecodeChunkSegs")
	}
	total := HeaderSize + int(h.Length)
	for len(buf) < total {
		if len(buf) == cap(buf) {
			n := min(max(2*cap(buf), readGrowStep), total)
			nb := make([]byte, len(buf), n)
			copy(nb, buf)
			buf = nb
		}
		n, err := io.ReadFull(r, buf[len(buf):min(cap(buf), total)])
		buf = buf[:len(buf)+n]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return h, nil, buf, fmt.Errorf("wire: read %s body (%d of %d bytes): %w", h.Type, len(buf)-HeaderSize, h.Length, err)
		}
	}
	body := buf[HeaderSize:total]
	if err := VerifyCRC(h, body); err != nil {
		return h, nil, buf, err
	}
	m, err := Decode(h.Type, body)
	if err != nil {
		return h, nil, buf, err
	}
	return h, m, buf, nil
}
