package mysqlbinlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// maxPayload is the largest payload of one packet; a longer one is split,
// and a payload of exactly this length is followed by another packet.
const maxPayload = 1<<24 - 1

// ErrMalformed reports bytes that do not follow the protocol.
var ErrMalformed = errors.New("mysqlbinlog: malformed data")

// packetIO frames packets on a stream: a 3-byte length, a sequence id,
// the payload.
type packetIO struct {
	rw  io.ReadWriter
	seq uint8
	hdr [4]byte
}

// readPacket reads one logical packet, joining the parts of a split one.
func (p *packetIO) readPacket() ([]byte, error) {
	var out []byte
	for {
		if _, err := io.ReadFull(p.rw, p.hdr[:]); err != nil {
			return nil, err
		}
		n := int(p.hdr[0]) | int(p.hdr[1])<<8 | int(p.hdr[2])<<16
		if p.hdr[3] != p.seq {
			return nil, fmt.Errorf("%w: packet sequence %d, want %d", ErrMalformed, p.hdr[3], p.seq)
		}
		p.seq++
		start := len(out)
		out = append(out, make([]byte, n)...)
		if _, err := io.ReadFull(p.rw, out[start:]); err != nil {
			return nil, err
		}
		if n < maxPayload {
			return out, nil
		}
	}
}

// writePacket writes payload, split into packets of at most maxPayload
// bytes (and an empty last one when its length is a multiple of it).
func (p *packetIO) writePacket(payload []byte) error {
	for {
		n := min(len(payload), maxPayload)
		buf := make([]byte, 4+n)
		buf[0], buf[1], buf[2], buf[3] = byte(n), byte(n>>8), byte(n>>16), p.seq
		copy(buf[4:], payload[:n])
		p.seq++
		if _, err := p.rw.Write(buf); err != nil {
			return err
		}
		payload = payload[n:]
		if n < maxPayload {
			return nil
		}
	}
}

// reader reads the fields of a payload; the first short read sets err and
// every later read returns zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: short %s", ErrMalformed, what)
	}
	r.b = nil
}

func (r *reader) bytes(n int, what string) []byte {
	if r.err != nil || n < 0 || n > len(r.b) {
		r.fail(what)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) uint8(what string) uint8 {
	b := r.bytes(1, what)
	if b == nil {
		return 0
	}
	return b[0]
}

func (r *reader) uint16(what string) uint16 {
	b := r.bytes(2, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}

func (r *reader) uint32(what string) uint32 {
	b := r.bytes(4, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *reader) uint64(what string) uint64 {
	b := r.bytes(8, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// uintN reads an n-byte little-endian unsigned integer (n <= 8).
func (r *reader) uintN(n int, what string) uint64 {
	b := r.bytes(n, what)
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// lenenc reads a length-encoded integer; null reports the 0xFB marker of a
// NULL column in a text row.
func (r *reader) lenenc(what string) (v uint64, null bool) {
	first := r.uint8(what)
	switch {
	case first < 0xfb:
		return uint64(first), false
	case first == 0xfb:
		return 0, true
	case first == 0xfc:
		return r.uintN(2, what), false
	case first == 0xfd:
		return r.uintN(3, what), false
	case first == 0xfe:
		return r.uint64(what), false
	}
	r.fail(what)
	return 0, false
}

// lenencBytes reads a length-encoded string.
func (r *reader) lenencBytes(what string) (b []byte, null bool) {
	n, null := r.lenenc(what)
	if null || r.err != nil {
		return nil, null
	}
	if n > uint64(len(r.b)) {
		r.fail(what)
		return nil, false
	}
	return r.bytes(int(n), what), false
}

// cstring reads a NUL-terminated string; without a NUL it takes the rest.
func (r *reader) cstring(what string) string {
	if r.err != nil {
		return ""
	}
	for i, c := range r.b {
		if c == 0 {
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		}
	}
	s := string(r.b)
	r.b = nil
	return s
}

// rest takes what is left.
func (r *reader) rest() []byte {
	v := r.b
	r.b = nil
	return v
}

// appendLenenc appends v as a length-encoded integer.
func appendLenenc(b []byte, v uint64) []byte {
	switch {
	case v < 0xfb:
		return append(b, byte(v))
	case v < 1<<16:
		return append(b, 0xfc, byte(v), byte(v>>8))
	case v < 1<<24:
		return append(b, 0xfd, byte(v), byte(v>>8), byte(v>>16))
	}
	return binary.LittleEndian.AppendUint64(append(b, 0xfe), v)
}
