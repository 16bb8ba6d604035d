package mysqlbinlog

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MariaGTID is a MariaDB global transaction id: domain-server-sequence.
type MariaGTID struct {
	Domain   uint32
	Server   uint32
	Sequence uint64
}

func (g MariaGTID) String() string {
	return fmt.Sprintf("%d-%d-%d", g.Domain, g.Server, g.Sequence)
}

// MariaGTIDPos is a MariaDB GTID position: the last transaction of each
// replication domain, as @slave_connect_state takes it.
type MariaGTIDPos map[uint32]MariaGTID

// ParseMariaGTIDPos parses "0-1-100,1-2-7" ("" is the empty position).
func ParseMariaGTIDPos(s string) (MariaGTIDPos, error) {
	pos := MariaGTIDPos{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, "-")
		if len(f) != 3 {
			return nil, fmt.Errorf("mysqlbinlog: invalid MariaDB GTID %q (want domain-server-sequence)", part)
		}
		d, err1 := strconv.ParseUint(f[0], 10, 32)
		sv, err2 := strconv.ParseUint(f[1], 10, 32)
		sq, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("mysqlbinlog: invalid MariaDB GTID %q (want domain-server-sequence)", part)
		}
		if _, dup := pos[uint32(d)]; dup {
			return nil, fmt.Errorf("mysqlbinlog: MariaDB GTID position %q names domain %d twice", s, d)
		}
		pos[uint32(d)] = MariaGTID{Domain: uint32(d), Server: uint32(sv), Sequence: sq}
	}
	return pos, nil
}

// Update records g as its domain's last transaction.
func (p MariaGTIDPos) Update(g MariaGTID) { p[g.Domain] = g }

// String formats the position as "0-1-100,1-2-7", domains in order.
func (p MariaGTIDPos) String() string {
	domains := make([]uint32, 0, len(p))
	for d := range p {
		domains = append(domains, d)
	}
	slices.Sort(domains)
	parts := make([]string, len(domains))
	for i, d := range domains {
		parts[i] = p[d].String()
	}
	return strings.Join(parts, ",")
}

// Interval is a range of MySQL transaction numbers, Start to End
// inclusive.
type Interval struct{ Start, End int64 }

// MySQLGTIDSet is a MySQL GTID set: per source UUID, intervals of
// transaction numbers.
type MySQLGTIDSet map[[16]byte][]Interval

// ParseMySQLGTIDSet parses "uuid:1-5:7,uuid2:1-3" ("" is the empty set).
func ParseMySQLGTIDSet(s string) (MySQLGTIDSet, error) {
	set := MySQLGTIDSet{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, ":")
		raw, err := hex.DecodeString(strings.ReplaceAll(f[0], "-", ""))
		if err != nil || len(raw) != 16 || len(f) < 2 {
			return nil, fmt.Errorf("mysqlbinlog: invalid MySQL GTID set element %q (want uuid:n-m)", part)
		}
		sid := [16]byte(raw)
		for _, iv := range f[1:] {
			a, b, found := strings.Cut(iv, "-")
			start, err1 := strconv.ParseInt(a, 10, 64)
			end := start
			var err2 error
			if found {
				end, err2 = strconv.ParseInt(b, 10, 64)
			}
			if err1 != nil || err2 != nil || start < 1 || end < start {
				return nil, fmt.Errorf("mysqlbinlog: invalid MySQL GTID interval %q in %q", iv, part)
			}
			set.add(sid, Interval{start, end})
		}
	}
	return set, nil
}

// Add records transaction gno of source sid.
func (s MySQLGTIDSet) Add(sid [16]byte, gno int64) { s.add(sid, Interval{gno, gno}) }

// add merges iv into sid's sorted, disjoint intervals.
func (s MySQLGTIDSet) add(sid [16]byte, iv Interval) {
	ivs := append(s[sid], iv)
	slices.SortFunc(ivs, func(a, b Interval) int { return int(min(max(a.Start-b.Start, -1), 1)) })
	out := ivs[:1]
	for _, x := range ivs[1:] {
		last := &out[len(out)-1]
		if x.Start <= last.End+1 {
			last.End = max(last.End, x.End)
			continue
		}
		out = append(out, x)
	}
	s[sid] = out
}

// String formats the set the way MySQL prints it.
func (s MySQLGTIDSet) String() string {
	sids := make([][16]byte, 0, len(s))
	for sid := range s {
		sids = append(sids, sid)
	}
	slices.SortFunc(sids, func(a, b [16]byte) int { return strings.Compare(string(a[:]), string(b[:])) })
	parts := make([]string, 0, len(sids))
	for _, sid := range sids {
		var b strings.Builder
		h := hex.EncodeToString(sid[:])
		b.WriteString(h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:])
		for _, iv := range s[sid] {
			if iv.Start == iv.End {
				fmt.Fprintf(&b, ":%d", iv.Start)
			} else {
				fmt.Fprintf(&b, ":%d-%d", iv.Start, iv.End)
			}
		}
		parts = append(parts, b.String())
	}
	return strings.Join(parts, ",")
}

// encode is the set's binary form, as COM_BINLOG_DUMP_GTID and the
// PREVIOUS_GTIDS event carry it: the number of sources; per source its
// UUID, the number of intervals and each interval's start and end, the
// end exclusive.
func (s MySQLGTIDSet) encode() []byte {
	sids := make([][16]byte, 0, len(s))
	for sid := range s {
		sids = append(sids, sid)
	}
	slices.SortFunc(sids, func(a, b [16]byte) int { return strings.Compare(string(a[:]), string(b[:])) })
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(sids)))
	for _, sid := range sids {
		b = append(b, sid[:]...)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s[sid])))
		for _, iv := range s[sid] {
			b = binary.LittleEndian.AppendUint64(b, uint64(iv.Start))
			b = binary.LittleEndian.AppendUint64(b, uint64(iv.End+1))
		}
	}
	return b
}

// decodeMySQLGTIDSet reads the binary form encode writes.
func decodeMySQLGTIDSet(p []byte) (MySQLGTIDSet, error) {
	r := reader{b: p}
	n := r.uint64("gtid set size")
	if r.err != nil || n > uint64(len(r.b))/24 {
		return nil, fmt.Errorf("%w: gtid set", ErrMalformed)
	}
	set := MySQLGTIDSet{}
	for range n {
		raw := r.bytes(16, "gtid sid")
		k := r.uint64("gtid intervals")
		if r.err != nil || k > uint64(len(r.b))/16 {
			return nil, fmt.Errorf("%w: gtid set intervals", ErrMalformed)
		}
		sid := [16]byte(raw)
		for range k {
			start, end := int64(r.uint64("interval start")), int64(r.uint64("interval end"))
			if start < 1 || end <= start {
				return nil, fmt.Errorf("%w: gtid interval %d-%d", ErrMalformed, start, end)
			}
			set.add(sid, Interval{start, end - 1})
		}
	}
	return set, r.err
}
