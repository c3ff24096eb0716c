package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The module's own commands: the raw batch commands (one call, one slot,
// at most MaxBatch keys: ClaimMany and friends split for you) and the Bloom
// filters. Each answers a *ModuleRequiredError on the Functions edition.

// MClaimArgs are IDEM.MCLAIM's options.
type MClaimArgs struct {
	Payloads [][]byte // nil, or one per key
	MaxTries int
	Bloom    string
	Owner    string // OWNER, for every key ("": none)
}

// MDoneArgs are IDEM.MDONE's options.
type MDoneArgs struct {
	Retain time.Duration
	Bloom  string
}

func (i *Idem) moduleOnly(ctx context.Context, name string) error {
	ed, err := i.Edition(ctx)
	if err != nil {
		return err
	}
	if ed != EditionModule {
		return moduleRequired(name)
	}
	return nil
}

// MClaim sends IDEM.MCLAIM: one answer per key, a key's error in its Err.
func (i *Idem) MClaim(ctx context.Context, keys []string, lease time.Duration, args MClaimArgs) ([]ClaimReply, error) {
	if err := i.moduleOnly(ctx, "IDEM.MCLAIM"); err != nil {
		return nil, err
	}
	secs, err := seconds("lease", lease)
	if err != nil {
		return nil, err
	}
	if args.Payloads != nil && len(args.Payloads) != len(keys) {
		return nil, errors.New("idem: one payload per key")
	}
	v, err := i.do(ctx, i.core.mclaimCmd(keys, secs, args), false)
	if err != nil {
		return nil, err
	}
	arr, _ := v.([]any)
	out := make([]ClaimReply, len(arr))
	for j, el := range arr {
		out[j], out[j].Err = parseClaim(el)
	}
	return out, nil
}

func (c *core) mclaimCmd(keys []string, leaseSecs int64, args MClaimArgs) []any {
	cmd := make([]any, 0, 3+2*len(keys)+8)
	cmd = append(cmd, "IDEM.MCLAIM", leaseSecs, len(keys))
	for _, k := range keys {
		cmd = append(cmd, c.prefix+k)
	}
	if args.Payloads != nil {
		cmd = append(cmd, "PAYLOADS")
		for _, p := range args.Payloads {
			cmd = append(cmd, p)
		}
	}
	if args.MaxTries > 0 {
		cmd = append(cmd, "MAXTRIES", args.MaxTries)
	}
	if args.Owner != "" {
		cmd = append(cmd, "OWNER", args.Owner)
	}
	if args.Bloom != "" {
		cmd = append(cmd, "BLOOM", c.prefix+args.Bloom)
	}
	return cmd
}

// MDone sends IDEM.MDONE. When any item has a Result, every item's is
// sent, a nil one as the empty string.
func (i *Idem) MDone(ctx context.Context, items []DoneItem, args MDoneArgs) ([]DoneAnswer, error) {
	if err := i.moduleOnly(ctx, "IDEM.MDONE"); err != nil {
		return nil, err
	}
	if args.Retain != 0 {
		if _, err := seconds("retain", args.Retain); err != nil {
			return nil, err
		}
	}
	v, err := i.do(ctx, i.core.mdoneCmd(items, args), false)
	if err != nil {
		return nil, err
	}
	arr, _ := v.([]any)
	out := make([]DoneAnswer, len(arr))
	for j, el := range arr {
		if e, ok := el.(error); ok {
			out[j].Err = serverError(e)
		} else {
			n, _ := el.(int64)
			out[j].Code = DoneCode(n)
		}
	}
	return out, nil
}

// mdoneCmd: args.Retain is whole seconds (checked by the callers).
func (c *core) mdoneCmd(items []DoneItem, args MDoneArgs) []any {
	cmd := make([]any, 0, 2+3*len(items)+5)
	cmd = append(cmd, "IDEM.MDONE", len(items))
	withResults := false
	for _, it := range items {
		cmd = append(cmd, c.prefix+it.Key, it.Token)
		withResults = withResults || it.Result != nil
	}
	if withResults {
		// RESULTS has one value per key: an item without one stores ""
		// here (the batch helpers send such items in a call of their own).
		cmd = append(cmd, "RESULTS")
		for _, it := range items {
			cmd = append(cmd, it.Result)
		}
	}
	if args.Retain != 0 {
		cmd = append(cmd, "RETAIN", int64(args.Retain/time.Second))
	}
	if args.Bloom != "" {
		cmd = append(cmd, "BLOOM", c.prefix+args.Bloom)
	}
	return cmd
}

// MRelease sends IDEM.MRELEASE.
func (i *Idem) MRelease(ctx context.Context, items []ReleaseItem) ([]ReleaseAnswer, error) {
	if err := i.moduleOnly(ctx, "IDEM.MRELEASE"); err != nil {
		return nil, err
	}
	v, err := i.do(ctx, i.core.mreleaseCmd(items), false)
	if err != nil {
		return nil, err
	}
	arr, _ := v.([]any)
	out := make([]ReleaseAnswer, len(arr))
	for j, el := range arr {
		if e, ok := el.(error); ok {
			out[j].Err = serverError(e)
		} else {
			out[j].Released = el == int64(1)
		}
	}
	return out, nil
}

func (c *core) mreleaseCmd(items []ReleaseItem) []any {
	cmd := make([]any, 0, 2+2*len(items))
	cmd = append(cmd, "IDEM.MRELEASE", len(items))
	for _, it := range items {
		cmd = append(cmd, c.prefix+it.Key, it.Token)
	}
	return cmd
}

// BFReserveArgs are IDEM.BF.RESERVE's options (zero: the server's default).
type BFReserveArgs struct {
	Window    int
	Shard     time.Duration // whole seconds; 24h and 1h are sent as DAY and HOUR
	Expansion int
}

// BFReserve sends IDEM.BF.RESERVE.
func (i *Idem) BFReserve(ctx context.Context, key string, errorRate float64, capacity int64, args BFReserveArgs) error {
	if err := i.moduleOnly(ctx, "IDEM.BF.RESERVE"); err != nil {
		return err
	}
	cmd := []any{"IDEM.BF.RESERVE", i.core.prefix + key, errorRate, capacity}
	if args.Window > 0 {
		cmd = append(cmd, "WINDOW", args.Window)
	}
	switch {
	case args.Shard == 24*time.Hour:
		cmd = append(cmd, "SHARD", "DAY")
	case args.Shard == time.Hour:
		cmd = append(cmd, "SHARD", "HOUR")
	case args.Shard != 0:
		secs, err := seconds("shard", args.Shard)
		if err != nil {
			return err
		}
		cmd = append(cmd, "SHARD", secs)
	}
	if args.Expansion > 0 {
		cmd = append(cmd, "EXPANSION", args.Expansion)
	}
	_, err := i.do(ctx, cmd, false)
	return err
}

// BFAdd sends IDEM.BF.ADD: true when the item was not seen in the window.
func (i *Idem) BFAdd(ctx context.Context, key, item string) (bool, error) {
	return i.bfOne(ctx, "IDEM.BF.ADD", key, item)
}

// BFMAdd sends IDEM.BF.MADD.
func (i *Idem) BFMAdd(ctx context.Context, key string, items ...string) ([]bool, error) {
	return i.bf(ctx, "IDEM.BF.MADD", key, items)
}

// BFExists sends IDEM.BF.EXISTS: true when the item may have been seen.
func (i *Idem) BFExists(ctx context.Context, key, item string) (bool, error) {
	return i.bfOne(ctx, "IDEM.BF.EXISTS", key, item)
}

// BFMExists sends IDEM.BF.MEXISTS.
func (i *Idem) BFMExists(ctx context.Context, key string, items ...string) ([]bool, error) {
	return i.bf(ctx, "IDEM.BF.MEXISTS", key, items)
}

func (i *Idem) bfOne(ctx context.Context, name, key, item string) (bool, error) {
	b, err := i.bf(ctx, name, key, []string{item})
	if err != nil {
		return false, err
	}
	return b[0], nil
}

func (i *Idem) bf(ctx context.Context, name, key string, items []string) ([]bool, error) {
	if err := i.moduleOnly(ctx, name); err != nil {
		return nil, err
	}
	cmd := []any{name, i.core.prefix + key}
	for _, it := range items {
		cmd = append(cmd, it)
	}
	v, err := i.do(ctx, cmd, false)
	if err != nil {
		return nil, err
	}
	if n, ok := v.(int64); ok {
		return []bool{n == 1}, nil
	}
	arr, _ := v.([]any)
	out := make([]bool, len(arr))
	for j, el := range arr {
		out[j] = el == int64(1)
	}
	return out, nil
}

// FilterInfo is IDEM.BF.INFO's answer.
type FilterInfo struct {
	ErrorRate float64
	Capacity  int64
	Window    int64
	Shard     time.Duration
	Expansion int64
	Items     int64
	Bytes     int64
	Shards    []FilterShard
}

// FilterShard is one live shard of a filter.
type FilterShard struct {
	Start   time.Time
	Items   int64
	Filters int64
	Bytes   int64
}

// BFInfo sends IDEM.BF.INFO: nil without error for a missing filter.
func (i *Idem) BFInfo(ctx context.Context, key string) (*FilterInfo, error) {
	if err := i.moduleOnly(ctx, "IDEM.BF.INFO"); err != nil {
		return nil, err
	}
	v, err := i.do(ctx, []any{"IDEM.BF.INFO", i.core.prefix + key}, false)
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := fieldMap(v)
	if f == nil {
		return nil, fmt.Errorf("idem: unexpected BF.INFO reply %v", v)
	}
	info := &FilterInfo{
		Capacity: num(f["capacity"]), Window: num(f["window"]),
		Shard: time.Duration(num(f["shard"])) * time.Second, Expansion: num(f["expansion"]),
		Items: num(f["items"]), Bytes: num(f["bytes"]),
	}
	switch r := f["error_rate"].(type) {
	case float64:
		info.ErrorRate = r
	case string:
		fmt.Sscan(r, &info.ErrorRate)
	}
	shards, _ := f["shards"].([]any)
	for _, s := range shards {
		m := fieldMap(s)
		info.Shards = append(info.Shards, FilterShard{
			Start: time.Unix(num(m["start"]), 0), Items: num(m["items"]),
			Filters: num(m["filters"]), Bytes: num(m["bytes"]),
		})
	}
	return info, nil
}
