package idem

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ScanOptions are Scan's filters: a record is listed when it matches every
// one given (the zero value of each: no filter).
type ScanOptions struct {
	// State is the record's state now.
	State State
	// MinTries lists records whose tries (claims since the latest requeue)
	// are at least this: with StateReleased or StateExpired, a consumer's
	// dead letters for that MaxTries.
	MinTries int
	// Idle lists records whose latest change (claim, extension, release,
	// completion) is at least this old: whole seconds.
	Idle time.Duration
	// Match is a SCAN glob on the key, under the instance's prefix.
	Match string
	// Count is SCAN's hint of work per call (0: the server's, 10).
	Count int
}

// ScanIterator walks Scan's keys, as go-redis's ScanIterator walks SCAN's:
//
//	it := i.Scan(ctx, idem.ScanOptions{State: idem.StateReleased, MinTries: 3})
//	for it.Next(ctx) {
//		fmt.Println(it.Key())
//	}
//	if err := it.Err(); err != nil { ... }
type ScanIterator struct {
	idem    *Idem
	opts    ScanOptions
	args    []any // the options as sent, after the cursor
	edition Edition
	nodes   []processor // nil until the first Next
	node    int
	cursor  string
	keys    []string
	key     string
	err     error
}

// Scan lists the keys (without the prefix) of every record matching all
// the filters given: IDEM.SCAN (FCALL_RO idem_scan on the Functions
// edition) on each primary of a cluster in turn, on the server itself
// otherwise. A record present for the whole scan is listed at least once
// (SCAN's guarantee: maybe more). Nothing is sent before the first Next.
func (i *Idem) Scan(ctx context.Context, opts ScanOptions) *ScanIterator {
	return &ScanIterator{idem: i, opts: opts, cursor: "0"}
}

// Next moves to the next key: false at the end or on an error (see Err).
func (it *ScanIterator) Next(ctx context.Context) bool {
	if it.err != nil {
		return false
	}
	if it.nodes == nil && !it.start(ctx) {
		return false
	}
	for len(it.keys) == 0 {
		if it.node == len(it.nodes) {
			return false
		}
		cmd := []any{"IDEM.SCAN", it.cursor}
		if it.edition == EditionFunctions {
			cmd = []any{"FCALL_RO", "idem_scan", 0, it.cursor}
		}
		c := redis.NewCmd(ctx, append(cmd, it.args...)...)
		_ = it.nodes[it.node].Process(ctx, c)
		v, err := c.Result()
		if err != nil {
			it.err = serverError(err)
			return false
		}
		arr, ok := v.([]any)
		if len(arr) != 2 || !ok {
			it.err = fmt.Errorf("idem: unexpected SCAN reply %v", v)
			return false
		}
		found, _ := arr[1].([]any)
		for _, k := range found {
			it.keys = append(it.keys, strings.TrimPrefix(str(k), it.idem.core.prefix))
		}
		if it.cursor = str(arr[0]); it.cursor == "0" {
			it.node++
		}
	}
	it.key, it.keys = it.keys[0], it.keys[1:]
	return true
}

// Key is the current key, without the instance's prefix.
func (it *ScanIterator) Key() string { return it.key }

// Err is the error that ended the walk, nil at its end.
func (it *ScanIterator) Err() error { return it.err }

// start checks the options, asks the edition and finds the primaries.
func (it *ScanIterator) start(ctx context.Context) bool {
	o := it.opts
	match := o.Match
	if match == "" {
		match = "*"
	}
	it.args = []any{"MATCH", literalGlob(it.idem.core.prefix) + match}
	if o.Count > 0 {
		it.args = append(it.args, "COUNT", o.Count)
	}
	if o.State != "" {
		it.args = append(it.args, "STATE", string(o.State))
	}
	if o.MinTries > 0 {
		it.args = append(it.args, "MINTRIES", o.MinTries)
	}
	if o.Idle != 0 {
		secs, err := seconds("Idle", o.Idle)
		if err != nil {
			it.err = err
			return false
		}
		it.args = append(it.args, "IDLE", secs)
	}
	if it.edition, it.err = it.idem.Edition(ctx); it.err != nil {
		return false
	}
	it.nodes, it.err = primaries(ctx, it.idem.client)
	return it.err == nil
}

// processor is what Scan needs of a node's client.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// primaries is a cluster's primaries (in address order, so that a walk is
// repeatable), or the client itself.
func primaries(ctx context.Context, client redis.UniversalClient) ([]processor, error) {
	cc, ok := client.(*redis.ClusterClient)
	if !ok {
		return []processor{client}, nil
	}
	var mu sync.Mutex
	var nodes []*redis.Client
	err := cc.ForEachMaster(ctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, node)
		return nil
	})
	sort.Slice(nodes, func(a, b int) bool { return nodes[a].Options().Addr < nodes[b].Options().Addr })
	out := make([]processor, len(nodes))
	for n, node := range nodes {
		out[n] = node
	}
	return out, err
}

// literalGlob escapes a prefix's glob characters, so that MATCH takes it as
// it is.
func literalGlob(prefix string) string {
	var b strings.Builder
	for _, r := range prefix {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
