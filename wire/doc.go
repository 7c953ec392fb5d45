// Package wire owns every byte layout of stage: the 16-byte frame header,
// the peer protocol's control frames and chunk frames, and the local
// control-socket frames. docs/PROTOCOL.md describes the same layouts and the
// session sequences built on them.
//
// What it does: encode messages (AppendFrame, AppendBody, AppendHeader,
// AppendChunkHead), decode and check them (ParseHeader, Decode, DecodeAck,
// DecodeChunkFixed, DecodeChunkSegs), compute and verify CRC32C checksums
// (ChunkCRC, VerifyCRC), and read one control frame from a stream
// (ReadFrame). All integers are little-endian and fixed-width.
//
// What it never does: no I/O except through the io.Reader given to
// ReadFrame, no sockets, no goroutines, no global state beyond constant
// tables. Decoders never panic on any input and never allocate from a
// length they have not checked, first against its Max* limit and then
// against the bytes that remain; errors name the message, the field and the
// values, and wrap ErrMalformed, ErrTooLarge, ErrBadMagic, ErrBadVersion,
// ErrUnknownType or ErrChecksum.
//
// Buffers: Append* functions append to the caller's slice and return it,
// allocating only when it lacks room. Decoded messages share no memory with
// the input: strings and byte slices are copied, so the caller may reuse its
// buffer at once. DecodeChunkSegs and DecodeAck reuse the capacity of the
// slices already in the struct they are given, which the caller owns.
// ReadFrame returns its buffer for the next call.
package wire
