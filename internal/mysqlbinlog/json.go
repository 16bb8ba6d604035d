package mysqlbinlog

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// MySQL's binary JSON value types.
const (
	jsonSmallObject = 0x00
	jsonLargeObject = 0x01
	jsonSmallArray  = 0x02
	jsonLargeArray  = 0x03
	jsonLiteral     = 0x04
	jsonInt16       = 0x05
	jsonUint16      = 0x06
	jsonInt32       = 0x07
	jsonUint32      = 0x08
	jsonInt64       = 0x09
	jsonUint64      = 0x0a
	jsonDouble      = 0x0b
	jsonString      = 0x0c
	jsonOpaque      = 0x0f
)

// maxJSONDepth bounds the nesting a document may have (MySQL's own
// limit is 100).
const maxJSONDepth = 150

// decodeJSON turns a MySQL 8 binary JSON value (a JSON column in the
// binary log) into JSON text. An empty value is JSON null.
func decodeJSON(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return []byte("null"), nil
	}
	out, err := appendJSONValue(nil, b[0], b[1:], 0)
	if err != nil {
		return nil, fmt.Errorf("binary JSON: %w", err)
	}
	return out, nil
}

func jsonErr(what string) error { return fmt.Errorf("%w: %s", ErrMalformed, what) }

// appendJSONValue appends the value of type t whose data starts at b.
func appendJSONValue(out []byte, t byte, b []byte, depth int) ([]byte, error) {
	if depth > maxJSONDepth {
		return nil, jsonErr("JSON nested too deep")
	}
	switch t {
	case jsonSmallObject, jsonLargeObject, jsonSmallArray, jsonLargeArray:
		return appendJSONContainer(out, t, b, depth)
	case jsonLiteral:
		if len(b) < 1 {
			return nil, jsonErr("JSON literal")
		}
		switch b[0] {
		case 0:
			return append(out, "null"...), nil
		case 1:
			return append(out, "true"...), nil
		case 2:
			return append(out, "false"...), nil
		}
		return nil, jsonErr("JSON literal value")
	case jsonInt16, jsonUint16:
		if len(b) < 2 {
			return nil, jsonErr("JSON int16")
		}
		u := binary.LittleEndian.Uint16(b)
		if t == jsonInt16 {
			return strconv.AppendInt(out, int64(int16(u)), 10), nil
		}
		return strconv.AppendUint(out, uint64(u), 10), nil
	case jsonInt32, jsonUint32:
		if len(b) < 4 {
			return nil, jsonErr("JSON int32")
		}
		u := binary.LittleEndian.Uint32(b)
		if t == jsonInt32 {
			return strconv.AppendInt(out, int64(int32(u)), 10), nil
		}
		return strconv.AppendUint(out, uint64(u), 10), nil
	case jsonInt64, jsonUint64:
		if len(b) < 8 {
			return nil, jsonErr("JSON int64")
		}
		u := binary.LittleEndian.Uint64(b)
		if t == jsonInt64 {
			return strconv.AppendInt(out, int64(u), 10), nil
		}
		return strconv.AppendUint(out, u, 10), nil
	case jsonDouble:
		if len(b) < 8 {
			return nil, jsonErr("JSON double")
		}
		f := math.Float64frombits(binary.LittleEndian.Uint64(b))
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, jsonErr("JSON double not finite")
		}
		return strconv.AppendFloat(out, f, 'g', -1, 64), nil
	case jsonString:
		n, k, err := jsonVarlen(b)
		if err != nil {
			return nil, err
		}
		if n > uint64(len(b)-k) {
			return nil, jsonErr("JSON string length")
		}
		return appendJSONString(out, b[k:k+int(n)]), nil
	case jsonOpaque:
		// A MySQL type JSON has no literal for (dates, decimals, …): the
		// type byte, a length and the value in that type's binary form.
		if len(b) < 1 {
			return nil, jsonErr("JSON opaque")
		}
		n, k, err := jsonVarlen(b[1:])
		if err != nil {
			return nil, err
		}
		if n > uint64(len(b)-1-k) {
			return nil, jsonErr("JSON opaque length")
		}
		return nil, fmt.Errorf("mysqlbinlog: JSON opaque value of MySQL type %d is not supported", b[0])
	}
	return nil, jsonErr(fmt.Sprintf("JSON type 0x%02x", t))
}

// jsonVarlen reads a variable-length integer: 7 bits a byte, low first,
// the high bit set while more follow (at most 5 bytes).
func jsonVarlen(b []byte) (uint64, int, error) {
	var v uint64
	for i := 0; i < 5 && i < len(b); i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return v, i + 1, nil
		}
	}
	return 0, 0, jsonErr("JSON length")
}

// appendJSONString appends s as a JSON string.
func appendJSONString(out, s []byte) []byte {
	q, _ := json.Marshal(string(s)) // cannot fail for a string
	return append(out, q...)
}

// appendJSONContainer appends an object or array: element count and
// byte size (2 bytes each when small, 4 when large), then for an object
// the key entries (offset, 2-byte length), then the value entries (type
// and an offset or, for small scalars, the value inline). Offsets count
// from the container's start.
func appendJSONContainer(out []byte, t byte, b []byte, depth int) ([]byte, error) {
	large := t == jsonLargeObject || t == jsonLargeArray
	object := t == jsonSmallObject || t == jsonLargeObject
	w := 2
	if large {
		w = 4
	}
	word := func(off int) (uint64, bool) {
		if off < 0 || off+w > len(b) {
			return 0, false
		}
		if large {
			return uint64(binary.LittleEndian.Uint32(b[off:])), true
		}
		return uint64(binary.LittleEndian.Uint16(b[off:])), true
	}
	count, ok1 := word(0)
	size, ok2 := word(w)
	if !ok1 || !ok2 || size > uint64(len(b)) || count > size {
		return nil, jsonErr("JSON container header")
	}
	b = b[:size]
	keyEntry := w + 2
	valueEntry := 1 + w
	header := 2 * w
	if object {
		header += int(count) * keyEntry
	}
	if uint64(header)+count*uint64(valueEntry) > size {
		return nil, jsonErr("JSON container entries")
	}
	if object {
		out = append(out, '{')
	} else {
		out = append(out, '[')
	}
	for i := range int(count) {
		if i > 0 {
			out = append(out, ',')
		}
		if object {
			ke := 2*w + i*keyEntry
			koff, _ := word(ke)
			klen := uint64(binary.LittleEndian.Uint16(b[ke+w:]))
			if koff+klen > size {
				return nil, jsonErr("JSON key")
			}
			out = appendJSONString(out, b[koff:koff+klen])
			out = append(out, ':')
		}
		ve := header + i*valueEntry
		vt := b[ve]
		inline := vt == jsonLiteral || vt == jsonInt16 || vt == jsonUint16 ||
			(large && (vt == jsonInt32 || vt == jsonUint32))
		var err error
		if inline {
			out, err = appendJSONValue(out, vt, b[ve+1:ve+1+w], depth+1)
		} else {
			voff, _ := word(ve + 1)
			if voff >= size {
				return nil, jsonErr("JSON value offset")
			}
			out, err = appendJSONValue(out, vt, b[voff:], depth+1)
		}
		if err != nil {
			return nil, err
		}
	}
	if object {
		return append(out, '}'), nil
	}
	return append(out, ']'), nil
}
