package idem_test

// The conformance runner's steps: each op of ../conformance/README.md
// mapped to the library's API.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// charge is the typed steps' record (cases.json's `typed`).
type charge struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// hookCounts counts every hook's calls over a case.
type hookCounts struct {
	mu     sync.Mutex
	counts map[string]int
}

func (h *hookCounts) add(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[name]++
}

func (h *hookCounts) check(t *testing.T, want map[string]any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, n := range want {
		if float64(h.counts[name]) != n {
			t.Errorf("hooks_called: %s called %d times, want %v (all: %v)", name, h.counts[name], n, h.counts)
		}
	}
}

func (r *runner) makeOptions(o map[string]any) idem.Options {
	opts := idem.Options{Prefix: r.prefix, Batch: idem.BatchOn}
	offOr := func(v any) time.Duration {
		if d := ms(v); d > 0 {
			return d
		}
		return idem.Off
	}
	raising := map[string]bool{}
	for k, v := range o {
		switch k {
		case "lease_ms":
			opts.Lease = ms(v)
		case "wait_ms":
			opts.Wait = offOr(v)
		case "heartbeat_ms":
			opts.Heartbeat = offOr(v)
		case "max_tries":
			opts.MaxTries = int(v.(float64))
		case "oversize":
			if v == "error" {
				opts.Oversize = idem.OversizeError
			}
		case "owner":
			opts.Owner = v.(string)
		case "durable":
			d := v.(map[string]any)
			opts.Durable = &idem.Durable{Replicas: int(d["replicas"].(float64))}
			if t, ok := d["timeout_ms"]; ok {
				opts.Durable.Timeout = ms(t)
			}
			opts.Durable.Fsync, _ = d["fsync"].(bool)
		case "hooks":
			for hook, what := range v.(map[string]any) {
				if what != "raise" || (hook != "on_run" && hook != "on_done") {
					r.t.Fatalf("hook %s: %v", hook, what)
				}
				raising[hook] = true
			}
		default:
			r.t.Fatalf("unknown option %s", k)
		}
	}
	r.hooks = &hookCounts{counts: map[string]int{}}
	h, fail := r.hooks, errors.New("hook failed")
	opts.Hooks = idem.Hooks{
		OnRun: func(*idem.Job) error {
			h.add("on_run")
			if raising["on_run"] {
				return fail
			}
			return nil
		},
		OnDone: func(*idem.Job, bool) error {
			h.add("on_done")
			if raising["on_done"] {
				return fail
			}
			return nil
		},
		OnReplay:        func(string, int64) { h.add("on_replay") },
		OnBusy:          func(string, time.Duration) { h.add("on_busy") },
		OnRelease:       func(*idem.Job, error) { h.add("on_release") },
		OnLeaseLost:     func(*idem.Job) { h.add("on_lease_lost") },
		OnResultDropped: func(*idem.Job, string) { h.add("on_result_dropped") },
	}
	return opts
}

// workRun is what one call's work did.
type workRun struct {
	ran      bool
	lostSeen bool
	jobKey   string
	started  chan struct{}
}

func (r *runner) work(spec map[string]any, w *workRun) idem.Work[any] {
	return func(ctx context.Context, job *idem.Job) (any, error) {
		w.ran, w.jobKey = true, job.Key()
		close(w.started)
		if g, ok := spec["gate"].(string); ok {
			<-r.gate(g)
		}
		if d, ok := spec["sleep_ms"]; ok {
			time.Sleep(ms(d))
		}
		w.lostSeen = job.Lost()
		if msg, ok := spec["raise"].(string); ok {
			return nil, errors.New(msg)
		}
		if _, ok := spec["return_unserializable"]; ok {
			return make(chan int), nil
		}
		if n, ok := spec["return_bytes"]; ok {
			return strings.Repeat("x", int(n.(float64))), nil
		}
		return spec["return"], nil
	}
}

type bgCall struct {
	w     *workRun
	done  chan struct{}
	res   idem.Outcome[any]
	typed bool // res.Value is the charge a typed call returned
	err   error
	http  *httpOutcome
}

func (r *runner) process(step map[string]any) *bgCall {
	if step["options"] != nil {
		r.t.Fatalf("per-call options of process are not mapped: %v", step["options"])
	}
	call := &bgCall{w: &workRun{started: make(chan struct{})}, done: make(chan struct{})}
	var opts []idem.CallOption
	if p, ok := step["payload"].(string); ok {
		opts = append(opts, idem.WithPayload([]byte(p)))
	}
	key, work := step["key"].(string), r.work(step["work"].(map[string]any), call.w)
	go func() {
		defer close(call.done)
		if typed, _ := step["typed"].(bool); typed {
			call.typed = true
			res, err := idem.Process(r.ctx, r.i, key, func(ctx context.Context, job *idem.Job) (charge, error) {
				v, err := work(ctx, job)
				var c charge
				if err == nil {
					data, _ := json.Marshal(v)
					err = json.Unmarshal(data, &c)
				}
				return c, err
			}, opts...)
			call.res = idem.Outcome[any]{Value: res.Value, Replayed: res.Replayed, ResultStored: res.ResultStored,
				Status: res.Status, Attempt: res.Attempt}
			call.err = err
			return
		}
		call.res, call.err = idem.Process(r.ctx, r.i, key, work, opts...)
	}()
	return call
}

func times(v any) int {
	switch v := v.(type) {
	case nil:
		return 1
	case float64:
		return int(v)
	case string:
		if v == "all" {
			return -1
		}
	}
	panic(fmt.Sprintf("times %v", v))
}

func (r *runner) step(at string, s map[string]any) {
	t, ctx := r.t, r.ctx
	expect := s["expect"]
	switch s["op"] {
	case "process":
		c := r.process(s)
		waitFor(t, at, c.done)
		r.checkCall(at, expect.(map[string]any), c)
	case "start":
		r.mu.Lock()
		r.calls[s["id"].(string)] = r.process(s)
		r.mu.Unlock()
	case "running":
		c := r.bg(s["id"])
		select {
		case <-c.w.started:
		case <-c.done:
			t.Fatalf("%s: the call ended (%v) before its work ran", at, c.err)
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: timed out", at)
		}
	case "waiting":
		r.waiting(at)
	case "finish":
		c := r.bg(s["id"])
		waitFor(t, at, c.done)
		r.checkCall(at, expect.(map[string]any), c)
	case "open":
		close(r.gate(s["gate"].(string)))
	case "process_many":
		r.processMany(at, s)
	case "claim":
		owner, _ := s["owner"].(string)
		reply, err := r.i.Claim(ctx, s["key"].(string), ms(s["lease_ms"]), idem.ClaimArgs{Owner: owner})
		reply.Err = err
		r.keep(s["as"], reply.Token)
		if expect != nil {
			r.checkClaim(at, expect.(map[string]any), reply)
		}
	case "done":
		var result []byte
		if res, ok := s["result"].(string); ok {
			result = []byte(res)
		}
		code, err := r.i.Done(ctx, s["key"].(string), r.token(s["token"].(string)), idem.DoneArgs{Result: result})
		if expect != nil {
			r.checkDone(at, expect.(map[string]any), idem.DoneAnswer{Code: code, Err: err})
		} else if err != nil {
			t.Fatalf("%s: %v", at, err)
		}
	case "release":
		released, err := r.i.Release(ctx, s["key"].(string), r.token(s["token"].(string)))
		if err != nil {
			t.Fatalf("%s: %v", at, err)
		}
		if e, ok := expect.(map[string]any); ok && e["released"] != released {
			t.Errorf("%s: released %v, want %v", at, released, e["released"])
		}
	case "claim_many":
		var keys []string
		for _, k := range s["keys"].([]any) {
			keys = append(keys, k.(string))
		}
		replies, err := r.i.ClaimMany(ctx, keys, ms(s["lease_ms"]), nil)
		if err != nil {
			t.Fatalf("%s: %v", at, err)
		}
		as, _ := s["as"].([]any)
		for n, reply := range replies {
			if as != nil {
				r.keep(as[n], reply.Token)
			}
			if e, ok := expect.([]any); ok {
				r.checkClaim(fmt.Sprintf("%s key %d", at, n), e[n].(map[string]any), reply)
			}
		}
	case "done_many", "release_many":
		r.settleMany(at, s)
	case "get":
		i := r.i
		if s["on"] == "replica" {
			i = r.onReplica()
		}
		rec, err := i.Get(ctx, s["key"].(string))
		if err != nil {
			t.Fatalf("%s: %v", at, err)
		}
		r.checkGet(at, expect, rec)
	case "set":
		if err := r.raw.Set(ctx, r.prefix+s["key"].(string), s["value"], 0).Err(); err != nil {
			t.Fatal(err)
		}
	case "del":
		if err := r.raw.Del(ctx, r.prefix+s["key"].(string)).Err(); err != nil {
			t.Fatal(err)
		}
	case "sleep":
		time.Sleep(ms(s["ms"]))
	case "unblock":
		for _, c := range r.blocked() {
			c.node.ClientUnblockWithError(ctx, c.id)
		}
	case "cut_reply", "cut_request":
		r.proxy.cut(s["command"].(string), s["op"] == "cut_request", times(s["times"]))
	case "command_calls":
		name := s["command"].(string)
		got := r.commandCalls()[name] - r.base[name]
		if want, ok := expect.(float64); ok && float64(got) != want {
			t.Errorf("%s: %s called %d times, want %v", at, name, got, want)
		}
		if most, ok := s["expect_max"].(float64); ok && float64(got) > most {
			t.Errorf("%s: %s called %d times, want at most %v", at, name, got, most)
		}
	case "replica":
		r.replica(at, s["action"].(string))
	case "failover":
		r.failover(at)
	case "http", "http_start", "http_finish", "handler_finished", "fingerprint":
		r.httpStep(at, s)
	default:
		t.Fatalf("%s: unknown op", at)
	}
}

// onReplica is an Idem reading the replica directly, under the case's prefix.
func (r *runner) onReplica() *idem.Idem {
	client := redis.NewClient(&redis.Options{Addr: r.tp.replica, Protocol: r.tp.protocol})
	r.t.Cleanup(func() { client.Close() })
	ed := idem.EditionModule
	if r.tp.edition == "functions" {
		ed = idem.EditionFunctions
	}
	i, err := idem.New(client, idem.Options{Prefix: r.prefix, Edition: ed})
	if err != nil {
		r.t.Fatal(err)
	}
	return i
}

func (r *runner) processMany(at string, s map[string]any) {
	var keys []string
	for _, k := range s["keys"].([]any) {
		keys = append(keys, k.(string))
	}
	works := s["work"].(map[string]any)
	runs := map[string]*workRun{}
	for _, k := range keys {
		runs[k] = &workRun{started: make(chan struct{})}
	}
	var opts []idem.CallOption
	if ps, ok := s["payloads"].([]any); ok {
		var payloads [][]byte
		for _, p := range ps {
			payloads = append(payloads, []byte(p.(string)))
		}
		opts = append(opts, idem.WithPayloads(payloads))
	}
	items, err := idem.ProcessMany(r.ctx, r.i, keys, func(ctx context.Context, job *idem.Job) (any, error) {
		return r.work(works[job.Key()].(map[string]any), runs[job.Key()])(ctx, job)
	}, opts...)
	if err != nil {
		r.t.Fatalf("%s: %v", at, err)
	}
	exp := s["expect"].([]any)
	if len(items) != len(exp) {
		r.t.Fatalf("%s: %d items, want %d", at, len(items), len(exp))
	}
	for n, e := range exp {
		r.checkItem(fmt.Sprintf("%s item %d", at, n), e.(map[string]any), items[n])
	}
}
