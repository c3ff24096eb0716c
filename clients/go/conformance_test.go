package idem_test

// The runner of ../conformance/cases.json: every case on every server
// config, none skipped. Standalone cases run side by side, each with its
// own prefix, client name and Idem; the replicated, Sentinel and cluster
// cases one after another on their topology (they count commands, detach
// the replica, fail the primary over).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
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
	ID          string           `json:"id"`
	Editions    []string         `json:"editions"`
	Topology    string           `json:"topology"`
	Needs       []string         `json:"needs"`
	Options     map[string]any   `json:"options"`
	Steps       []map[string]any `json:"steps"`
	Stats       map[string]any   `json:"stats"`
	HooksCalled map[string]any   `json:"hooks_called"`
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

// topology is where a case runs.
type topology struct {
	kind      string // standalone, cluster, replicated, sentinel
	edition   string
	protocol  int
	primaries []string // the library's server(s); commandstats are summed over them
	replica   string   // replicated, sentinel: the other server
	sentinel  string   // sentinel
}

// servers are every server of the topology (clients blocked are looked
// for on each).
func (tp topology) servers() []string {
	if tp.replica == "" {
		return tp.primaries
	}
	return append(slices.Clone(tp.primaries), tp.replica)
}

func TestConformance(t *testing.T) {
	cases := loadCases(t)
	of := func(kind, edition string) []conformanceCase {
		var out []conformanceCase
		for _, c := range cases {
			if c.Topology == kind && slices.Contains(c.Editions, edition) {
				out = append(out, c)
			}
		}
		return out
	}
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			if cfg.binary == "" {
				t.Skipf("%s: its server's variable is not set", cfg.name)
			}
			t.Parallel()
			t.Run("standalone", func(t *testing.T) {
				tp := topology{kind: "standalone", edition: cfg.edition, protocol: cfg.protocol, primaries: []string{serverFor(t, cfg)}}
				for _, c := range of("standalone", cfg.edition) {
					t.Run(c.ID, func(t *testing.T) {
						t.Parallel()
						tp := tp
						if counts(c) { // a server of its own: the others' commands are not its
							tp.primaries = []string{startServer(t, cfg.binary, cfg.edition == "module", false)}
							if cfg.edition == "functions" {
								loadFunctions(t, tp.primaries[0])
							}
						}
						newRunner(t, tp, c).run(c)
					})
				}
			})
			t.Run("replicated", func(t *testing.T) {
				t.Parallel()
				primary, replica := startPair(t, cfg)
				tp := topology{kind: "replicated", edition: cfg.edition, protocol: cfg.protocol, primaries: []string{primary}, replica: replica}
				for _, c := range of("replicated", cfg.edition) {
					t.Run(c.ID, func(t *testing.T) { newRunner(t, tp, c).run(c) })
				}
			})
			t.Run("sentinel", func(t *testing.T) {
				t.Parallel()
				primary, replica := startPair(t, cfg)
				tp := topology{kind: "sentinel", edition: cfg.edition, protocol: cfg.protocol, primaries: []string{primary},
					replica: replica, sentinel: startSentinel(t, cfg.binary, primary)}
				for _, c := range of("sentinel", cfg.edition) {
					t.Run(c.ID, func(t *testing.T) { newRunner(t, tp, c).run(c) })
				}
			})
		})
	}
	t.Run("cluster-module", func(t *testing.T) {
		t.Parallel()
		tp := topology{kind: "cluster", edition: "module", protocol: 3, primaries: clusterNodes(t)}
		for _, c := range of("cluster", "module") {
			t.Run(c.ID, func(t *testing.T) { newRunner(t, tp, c).run(c) })
		}
	})
}

// counts: the case counts the server's commands.
func counts(c conformanceCase) bool {
	for _, s := range c.Steps {
		if s["op"] == "command_calls" {
			return true
		}
	}
	return false
}

type runner struct {
	t        *testing.T
	ctx      context.Context
	tp       topology
	name     string
	prefix   string
	i        *idem.Idem
	raw      redis.UniversalClient // not through the proxy, for SET and DEL
	nodes    []*redis.Client       // every server, direct
	proxy    *proxy
	http     *httpHarness
	hooks    *hookCounts
	base     map[string]int64 // commandstats calls when the case began
	options  idem.Options
	detached bool   // the replica, by a step
	waitings uint64 // the waiting steps so far

	mu     sync.Mutex
	tokens map[string]string
	gates  map[string]chan struct{}
	calls  map[string]*bgCall
}

func newRunner(t *testing.T, tp topology, c conformanceCase) *runner {
	name := strings.TrimSuffix(fresh(tp.edition+"-"+c.ID), ":")
	r := &runner{t: t, ctx: context.Background(), tp: tp, name: name, prefix: name + ":",
		tokens: map[string]string{}, gates: map[string]chan struct{}{}, calls: map[string]*bgCall{}}
	libAddrs := tp.primaries
	if slices.Contains(c.Needs, "proxy") {
		r.proxy = startProxy(t, tp.primaries[0])
		libAddrs = []string{r.proxy.addr()}
	}
	var lib redis.UniversalClient
	switch tp.kind {
	case "cluster":
		lib = redis.NewClusterClient(&redis.ClusterOptions{Addrs: libAddrs, ClientName: name, Protocol: tp.protocol})
		r.raw = redis.NewClusterClient(&redis.ClusterOptions{Addrs: tp.primaries})
	case "sentinel":
		failover := func(clientName string) *redis.Client {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{tp.sentinel},
				ClientName: clientName, Protocol: tp.protocol})
		}
		lib, r.raw = failover(name), failover("")
	default:
		lib = redis.NewClient(&redis.Options{Addr: libAddrs[0], ClientName: name, Protocol: tp.protocol})
		r.raw = redis.NewClient(&redis.Options{Addr: tp.primaries[0]})
	}
	for _, a := range tp.servers() {
		r.nodes = append(r.nodes, redis.NewClient(&redis.Options{Addr: a}))
	}
	t.Cleanup(func() {
		lib.Close()
		r.raw.Close()
		for _, n := range r.nodes {
			n.Close()
		}
	})
	r.options = r.makeOptions(c.Options)
	i, err := idem.New(lib, r.options)
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

func (r *runner) run(c conformanceCase) {
	for n, step := range c.Steps {
		r.step(fmt.Sprintf("step %d (%v)", n+1, step["op"]), step)
		if r.t.Failed() {
			r.t.FailNow()
		}
	}
	r.checkStats(c.Stats)
	r.hooks.check(r.t, c.HooksCalled)
	if r.detached { // the next case finds the replica as it was
		r.replica("after the case", "attach")
	}
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
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

type blockedClient struct {
	node *redis.Client
	id   int64
}

// blocked lists this case's clients blocked in idem.claim, on every server.
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
	deadline := time.Now().Add(10 * time.Second)
	if r.tp.edition == "functions" {
		// No blocked client to see: a call counts its wait at its first BUSY answer.
		r.waitings++
		for r.i.Stats().Waits < r.waitings {
			if time.Now().After(deadline) {
				r.t.Fatalf("%s: no call of this case counted a wait", at)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return
	}
	for len(r.blocked()) == 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: no client of this case blocked in idem.claim", at)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// commandCalls sums INFO commandstats' calls over every primary.
func (r *runner) commandCalls() map[string]int64 {
	out := map[string]int64{}
	for _, node := range r.nodes[:len(r.tp.primaries)] {
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

// replica detaches the replicated topology's replica (it stops
// acknowledging) or attaches it again, in sync.
func (r *runner) replica(at, action string) {
	node := r.nodes[len(r.nodes)-1]
	switch action {
	case "detach":
		if err := node.SlaveOf(r.ctx, "NO", "ONE").Err(); err != nil {
			r.t.Fatalf("%s: %v", at, err)
		}
		r.detached = true
	case "attach":
		host, port, _ := net.SplitHostPort(r.tp.primaries[0])
		if err := node.SlaveOf(r.ctx, host, port).Err(); err != nil {
			r.t.Fatalf("%s: %v", at, err)
		}
		waitReplicaOnline(r.t, r.tp.primaries[0], r.tp.replica)
		r.detached = false
	default:
		r.t.Fatalf("%s: replica %s", at, action)
	}
}

// failover has the Sentinel promote the replica.
func (r *runner) failover(at string) {
	if err := sentinelFailover(r.ctx, r.tp.sentinel, r.tp.primaries[0], r.tp.replica); err != nil {
		r.t.Fatalf("%s: %v", at, err)
	}
}

// sentinelFailover has the Sentinel promote newPrimary and waits until the
// switch is whole: the Sentinel names it, it is a primary, and the old
// primary is its replica with the link up.
func sentinelFailover(ctx context.Context, sentinel, oldPrimary, newPrimary string) error {
	s := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer s.Close()
	deadline := time.Now().Add(60 * time.Second)
	// The replica has everything the case wrote: a Sentinel failover promotes
	// the replica as it is (asynchronous replication, which the case is not
	// about), and what it never acknowledged is lost.
	if err := waitAcknowledged(ctx, oldPrimary, deadline); err != nil {
		return err
	}
	for {
		err := s.Failover(ctx, "mymaster").Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("SENTINEL FAILOVER: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	newNode := redis.NewClient(&redis.Options{Addr: newPrimary})
	defer newNode.Close()
	oldNode := redis.NewClient(&redis.Options{Addr: oldPrimary})
	defer oldNode.Close()
	_, port, _ := net.SplitHostPort(newPrimary)
	for {
		addr, _ := s.GetMasterAddrByName(ctx, "mymaster").Result()
		role, _ := newNode.Do(ctx, "ROLE").Slice()
		info, _ := oldNode.Info(ctx, "replication").Result()
		f := infoFields(info)
		if len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == newPrimary && len(role) > 0 && role[0] == "master" &&
			f["role"] == "slave" && f["master_port"] == port && f["master_link_status"] == "up" {
			return waitAcknowledged(ctx, newPrimary, deadline)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the failover did not complete: sentinel %v, role %v, old primary %v", addr, role, f)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAcknowledged waits until primary's replica acknowledges a write made
// on it now (a SET, then WAIT 1 on the same connection): only then has it
// loaded its full sync and received everything written before. Listed
// online at the primary's offset is not that (both are 0 after a full sync
// until the first write, while the replica may still be loading it), and a
// WAIT after no write of its connection's own answers at once.
func waitAcknowledged(ctx context.Context, primary string, deadline time.Time) error {
	c := redis.NewClient(&redis.Options{Addr: primary})
	defer c.Close()
	for {
		conn := c.Conn()
		err := conn.Set(ctx, "topology:acknowledged", time.Now().UnixNano(), 0).Err()
		var acked int64
		if err == nil {
			acked, err = conn.Do(ctx, "WAIT", 1, 1000).Int64()
		}
		_ = conn.Close()
		if err == nil && acked >= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replica of %s does not acknowledge a write: %v", primary, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
