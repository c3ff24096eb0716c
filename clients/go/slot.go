package idem

import "strings"

// The batch planning: no I/O here. A cluster takes a batch command only
// when its keys share one hash slot, and no server takes more than
// MaxBatch keys in one.

// crcTable is CRC-16/XMODEM (polynomial 0x1021), the checksum of the Redis
// Cluster specification's key-to-slot mapping.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// slot is the cluster hash slot of key: the CRC16 of its hash tag (the text
// between the first "{" and the next "}", when not empty) or of the whole
// key, modulo 16384.
func slot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for j := 0; j < len(key); j++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^key[j]]
	}
	return int(crc) & 16383
}

// batches groups the indices of keys for the batch commands, each group in
// key order and at most MaxBatch long: one group per slot in a cluster,
// and apart by class (e.g. with or without a result), groups in the order
// of their first key.
func batches(keys []string, cluster bool, class func(int) int) [][]int {
	type group struct{ slot, class int }
	var order []group
	members := map[group][]int{}
	for j, k := range keys {
		g := group{}
		if cluster {
			g.slot = slot(k)
		}
		if class != nil {
			g.class = class(j)
		}
		if _, seen := members[g]; !seen {
			order = append(order, g)
		}
		members[g] = append(members[g], j)
	}
	var out [][]int
	for _, g := range order {
		for m := members[g]; len(m) > 0; {
			n := min(len(m), MaxBatch)
			out = append(out, m[:n])
			m = m[n:]
		}
	}
	return out
}
