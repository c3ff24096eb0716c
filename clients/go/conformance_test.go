package idem_test

// The runner of ../conformance/cases.json: every case that applies, on
// every server config, each case with its own prefix, client name and
// Idem (so cases on one server run side by side), the cluster's cases one
// after another (they count the servers' commandstats).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

type conformanceCase struct {
	ID       string           `json:"id"`
	Editions []string         `json:"editions"`
	Topology string           `json:"topology"`
	Needs    []string         `json:"needs"`
	Options  map[string]any   `json:"options"`
	Steps    []map[string]any `json:"steps"`
	Stats    map[string]any   `json:"stats"`
}

func loadCases(t *testing.T) []conformanceCase {
	data, err := os.ReadFile("../conformance/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []conformanceCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) == 0 {
		t.Fatal("no cases in cases.json")
	}
	return file.Cases
}

func TestConformance(t *testing.T) {
	cases := loadCases(t)
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			if cfg.binary == "" {
				t.Skipf("%s: its server's variable is not set", cfg.name)
			}
			t.Parallel()
			addr := serverFor(t, cfg)
			for n, c := range cases {
				if c.Topology != "standalone" || !slices.Contains(c.Editions, cfg.edition) {
					continue
				}
				t.Run(c.ID, func(t *testing.T) {
					t.Parallel()
					r := newRunner(t, fmt.Sprintf("%s-%d", cfg.name, n), cfg.edition, []string{addr}, false, cfg.protocol, c)
					r.run(c)
				})
			}
		})
	}
	t.Run("cluster-module", func(t *testing.T) {
		t.Parallel()
		nodes := clusterNodes(t)
		for n, c := range cases {
			if c.Topology != "cluster" || !slices.Contains(c.Editions, "module") {
				continue
			}
			t.Run(c.ID, func(t *testing.T) {
				r := newRunner(t, fmt.Sprintf("cluster-%d", n), "module", nodes, true, 3, c)
				r.run(c)
			})
		}
	})
}

type runner struct {
	t       *testing.T
	ctx     context.Context
	name    string
	edition string
	prefix  string
	i       *idem.Idem
	raw     redis.UniversalClient // direct, for SET and DEL
	nodes   []*redis.Client       // each primary, direct
	proxy   *proxy
	http    *httpHarness
	base    map[string]int64 // commandstats calls when the case began

	mu     sync.Mutex
	tokens map[string]string
	gates  map[string]chan struct{}
	calls  map[string]*bgCall
}

func newRunner(t *testing.T, name, edition string, addrs []string, cluster bool, protocol int, c conformanceCase) *runner {
	name = strings.TrimSuffix(fresh(name), ":")
	r := &runner{t: t, ctx: context.Background(), name: name, edition: edition, prefix: name + ":",
		tokens: map[string]string{}, gates: map[string]chan struct{}{}, calls: map[string]*bgCall{}}
	libAddrs := addrs
	if slices.Contains(c.Needs, "proxy") {
		r.proxy = startProxy(t, addrs[0])
		libAddrs = []string{r.proxy.addr()}
	}
	var lib redis.UniversalClient
	if cluster {
		lib = redis.NewClusterClient(&redis.ClusterOptions{Addrs: libAddrs, ClientName: name, Protocol: protocol})
		r.raw = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	} else {
		lib = redis.NewClient(&redis.Options{Addr: libAddrs[0], ClientName: name, Protocol: protocol})
		r.raw = redis.NewClient(&redis.Options{Addr: addrs[0]})
	}
	for _, a := range addrs {
		r.nodes = append(r.nodes, redis.NewClient(&redis.Options{Addr: a}))
	}
	t.Cleanup(func() {
		lib.Close()
		r.raw.Close()
		for _, n := range r.nodes {
			n.Close()
		}
	})
	i, err := idem.New(lib, r.options(c.Options))
	if err != nil {
		t.Fatal(err)
	}
	r.i = i
	r.base = r.commandCalls()
	if slices.Contains(c.Needs, "middleware") {
		r.http = newHTTPHarness(t, r)
	}
	return r
}

func ms(v any) time.Duration { return time.Duration(v.(float64)) * time.Millisecond }

func (r *runner) options(o map[string]any) idem.Options {
	opts := idem.Options{Prefix: r.prefix}
	offOr := func(v any) time.Duration {
		if d := ms(v); d > 0 {
			return d
		}
		return idem.Off
	}
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
		case "hooks":
			for hook, what := range v.(map[string]any) {
				if what != "raise" {
					r.t.Fatalf("hook %s: %v", hook, what)
				}
				switch hook {
				case "on_run":
					opts.Hooks.OnRun = func(*idem.Job) error { return errors.New("hook failed") }
				case "on_done":
					opts.Hooks.OnDone = func(*idem.Job, bool) error { return errors.New("hook failed") }
				default:
					r.t.Fatalf("unknown hook %s", hook)
				}
			}
		default:
			r.t.Fatalf("unknown option %s", k)
		}
	}
	return opts
}

func (r *runner) run(c conformanceCase) {
	for n, step := range c.Steps {
		r.step(fmt.Sprintf("step %d (%v)", n+1, step["op"]), step)
		if r.t.Failed() {
			r.t.FailNow()
		}
	}
	r.checkStats(c.Stats)
}

func (r *runner) gate(name string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.gates[name]
	if !ok {
		g = make(chan struct{})
		r.gates[name] = g
	}
	return g
}

func (r *runner) token(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tokens[name]
}

func (r *runner) keep(name any, token string) {
	if s, ok := name.(string); ok && token != "" {
		r.mu.Lock()
		r.tokens[s] = token
		r.mu.Unlock()
	}
}

// workRun is what one call's work did.
type workRun struct {
	ran      bool
	lostSeen bool
	started  chan struct{}
}

func (r *runner) work(spec map[string]any, w *workRun) idem.Work[any] {
	return func(ctx context.Context, job *idem.Job) (any, error) {
		w.ran = true
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
	w    *workRun
	done chan struct{}
	res  idem.Result[any]
	err  error
	http *httpOutcome
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
	go func() {
		defer close(call.done)
		call.res, call.err = idem.Process(r.ctx, r.i, step["key"].(string), r.work(step["work"].(map[string]any), call.w), opts...)
	}()
	return call
}

func (r *runner) bg(id any) *bgCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.calls[id.(string)]
	if !ok {
		r.t.Fatalf("no call %v", id)
	}
	return c
}

func waitFor(t *testing.T, what string, ch <-chan struct{}) {
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
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
		waitFor(t, at, r.bg(s["id"]).w.started)
	case "waiting":
		r.waiting(at)
	case "finish":
		c := r.bg(s["id"])
		waitFor(t, at, c.done)
		r.checkCall(at, expect.(map[string]any), c)
	case "open":
		close(r.gate(s["gate"].(string)))
	case "process_many":
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
		items, err := idem.ProcessMany(ctx, r.i, keys, func(ctx context.Context, job *idem.Job) (any, error) {
			return r.work(works[job.Key()].(map[string]any), runs[job.Key()])(ctx, job)
		}, opts...)
		if err != nil {
			t.Fatalf("%s: %v", at, err)
		}
		exp := expect.([]any)
		if len(items) != len(exp) {
			t.Fatalf("%s: %d items, want %d", at, len(items), len(exp))
		}
		for n, e := range exp {
			r.checkItem(fmt.Sprintf("%s item %d", at, n), e.(map[string]any), items[n])
		}
	case "claim":
		reply, err := r.i.Claim(ctx, s["key"].(string), ms(s["lease_ms"]), idem.ClaimArgs{})
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
		rec, err := r.i.Get(ctx, s["key"].(string))
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
	case "cut_reply":
		if s["command"] != "done" {
			t.Fatalf("%s: cut_reply %v", at, s["command"])
		}
		r.proxy.armed.Store(true)
	case "command_calls":
		calls := r.commandCalls()
		name := s["command"].(string)
		if got, want := calls[name]-r.base[name], int64(expect.(float64)); got != want {
			t.Errorf("%s: %s called %d times, want %d", at, name, got, want)
		}
	case "http", "http_start", "http_finish", "handler_finished", "fingerprint":
		r.httpStep(at, s)
	default:
		t.Fatalf("%s: unknown op", at)
	}
}

type blockedClient struct {
	node *redis.Client
	id   int64
}

// blocked lists this case's clients blocked in idem.claim, on every node.
func (r *runner) blocked() []blockedClient {
	var out []blockedClient
	for _, node := range r.nodes {
		list, err := node.ClientList(r.ctx).Result()
		if err != nil {
			r.t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			f := map[string]string{}
			for _, kv := range strings.Fields(line) {
				if k, v, ok := strings.Cut(kv, "="); ok {
					f[k] = v
				}
			}
			if f["name"] == r.name && strings.Contains(f["flags"], "b") && strings.EqualFold(f["cmd"], "idem.claim") {
				var id int64
				fmt.Sscan(f["id"], &id)
				out = append(out, blockedClient{node, id})
			}
		}
	}
	return out
}

func (r *runner) waiting(at string) {
	if r.edition == "functions" {
		time.Sleep(300 * time.Millisecond)
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(r.blocked()) == 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: no client of this case blocked in idem.claim", at)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// commandCalls sums INFO commandstats' calls over every node.
func (r *runner) commandCalls() map[string]int64 {
	out := map[string]int64{}
	for _, node := range r.nodes {
		info, err := node.Info(r.ctx, "commandstats").Result()
		if err != nil {
			r.t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
			if !ok {
				continue
			}
			var n int64
			fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &n)
			out[strings.ToLower(name)] += n
		}
	}
	return out
}
