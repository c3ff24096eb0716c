package idem_test

// Real servers for the tests, on free 127.0.0.1 ports: the module on
// Redis 7.0 (REDIS_SERVER, default redis-server), Redis 8.2
// (REDIS8_SERVER) and Valkey 9.1 (VALKEY_SERVER); the Functions edition
// (functions/idem.lua, no module) on Redis 7.0 and Valkey 9.1; a 3-node
// cluster with the module on Redis 7.0; for each config a primary with a
// replica, and a primary with a replica under a Sentinel (the server's own
// binary with --sentinel). REDIS_IDEM_MODULE is the module (default
// ../../target/release/libredis_idem.so).

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

type serverConfig struct {
	name     string
	binary   string // "" when its variable is not set: skipped
	edition  string // "module" or "functions"
	protocol int
}

func configs() []serverConfig {
	redis7 := os.Getenv("REDIS_SERVER")
	if redis7 == "" {
		redis7 = "redis-server"
	}
	return []serverConfig{
		{"redis7-module", redis7, "module", 3},
		{"redis8-module", os.Getenv("REDIS8_SERVER"), "module", 3},
		{"valkey9-module", os.Getenv("VALKEY_SERVER"), "module", 2},
		{"redis7-functions", redis7, "functions", 2},
		{"valkey9-functions", os.Getenv("VALKEY_SERVER"), "functions", 3},
	}
}

func modulePath() string {
	if p := os.Getenv("REDIS_IDEM_MODULE"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../../target/release/libredis_idem.so")
	return p
}

var (
	started   []*exec.Cmd
	dirs      []string
	startedMu sync.Mutex
)

func stopServers() {
	startedMu.Lock()
	defer startedMu.Unlock()
	for _, c := range started {
		_ = c.Process.Kill()
		_, _ = c.Process.Wait()
	}
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

// freePort is a free port; for a cluster node, one whose bus port
// (+10000) is free too.
func freePort(cluster bool) (int, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !cluster {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		if bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000)); err == nil {
			bus.Close()
			return port, nil
		}
	}
}

// startServer starts one server and waits until it answers.
func startServer(t testing.TB, binary string, module, cluster bool, extra ...string) string {
	t.Helper()
	addr, err := start(binary, module, cluster, extra...)
	for try := 2; err != nil && try <= 5; try++ { // a port taken between freePort and the server's bind
		addr, err = start(binary, module, cluster, extra...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func start(binary string, module, cluster bool, extra ...string) (string, error) {
	if _, err := os.Stat(modulePath()); module && err != nil {
		return "", fmt.Errorf("the module is missing (set REDIS_IDEM_MODULE): %v", err)
	}
	port, err := freePort(cluster)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "idem-go-test-")
	if err != nil {
		return "", err
	}
	args := []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}
	if module {
		args = append(args, "--loadmodule", modulePath())
	}
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
	}
	args = append(args, "--logfile", filepath.Join(dir, "server.log"))
	return launch(binary, dir, port, append(args, extra...))
}

// launch runs a server (or a Sentinel) and waits until it answers PING.
func launch(binary, dir string, port int, args []string) (string, error) {
	cmd := exec.Command(binary, args...)
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("starting %s: %v", binary, err)
	}
	startedMu.Lock()
	started, dirs = append(started, cmd), append(dirs, dir)
	startedMu.Unlock()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		// The pid, not a PING: another suite's server can take the port
		// first, and ours exits while theirs answers.
		info, err := c.InfoMap(context.Background(), "server").Result()
		if err == nil && info["Server"]["process_id"] == fmt.Sprint(cmd.Process.Pid) {
			return addr, nil
		}
		if err == nil || time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			return "", fmt.Errorf("%s did not start on %s (another process answers: %v):\n%s", binary, addr, err == nil, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func loadFunctions(t testing.TB, addr string) {
	lua, err := os.ReadFile("../../functions/idem.lua")
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.FunctionLoadReplace(context.Background(), string(lua)).Err(); err != nil {
		t.Fatal(err)
	}
}

// A started server per config, shared by the tests of that config.
var (
	exampleAddr string
	serversMu   sync.Mutex
	servers     = map[string]string{}
)

func serverFor(t testing.TB, cfg serverConfig) string {
	serversMu.Lock()
	defer serversMu.Unlock()
	if addr, ok := servers[cfg.name]; ok {
		return addr
	}
	addr := startServer(t, cfg.binary, cfg.edition == "module", false)
	if cfg.edition == "functions" {
		loadFunctions(t, addr)
	}
	servers[cfg.name] = addr
	return addr
}

// startPair starts a primary of cfg and a replica of it, in sync.
func startPair(t testing.TB, cfg serverConfig) (primary, replica string) {
	module := cfg.edition == "module"
	primary = startServer(t, cfg.binary, module, false)
	if !module {
		loadFunctions(t, primary)
	}
	host, port, _ := net.SplitHostPort(primary)
	replica = startServer(t, cfg.binary, module, false, "--replicaof", host, port)
	waitReplicaOnline(t, primary, replica)
	return primary, replica
}

// waitReplicaOnline waits until primary lists replica online at its own
// offset.
func waitReplicaOnline(t testing.TB, primary, replica string) {
	t.Helper()
	p := redis.NewClient(&redis.Options{Addr: primary})
	defer p.Close()
	_, port, _ := net.SplitHostPort(replica)
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, _ := p.Info(context.Background(), "replication").Result()
		fields := infoFields(info)
		for k, v := range fields {
			// Online, and acknowledging a write of its own connection
			// (waitAcknowledged: a replica listed online may still be
			// loading; docs/clients.md).
			if strings.HasPrefix(k, "slave") && strings.Contains(v, "port="+port+",") && strings.Contains(v, "state=online") &&
				strings.Contains(v, "offset="+fields["master_repl_offset"]+",") {
				if err := waitAcknowledged(context.Background(), primary, deadline); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica %s did not come online at %s: %s", replica, primary, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func infoFields(info string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}

// startSentinel starts a Sentinel (the server's binary with --sentinel)
// monitoring primary as mymaster, quorum 1, and waits until it knows the
// primary's replica.
func startSentinel(t testing.TB, binary, primary string) string {
	t.Helper()
	port, err := freePort(false)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "idem-go-sentinel-")
	if err != nil {
		t.Fatal(err)
	}
	host, pport, _ := net.SplitHostPort(primary)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor mymaster %s %s 1\nsentinel down-after-milliseconds mymaster 3000\n"+
		"sentinel failover-timeout mymaster 20000\n", port, dir, filepath.Join(dir, "server.log"), host, pport)
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := launch(binary, dir, port, []string{path, "--sentinel"})
	if err != nil {
		t.Fatal(err)
	}
	s := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer s.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		replicas, _ := s.Replicas(context.Background(), "mymaster").Result()
		if len(replicas) == 1 && replicas[0]["flags"] == "slave" && replicas[0]["master-link-status"] == "ok" {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinel %s did not see the replica: %v", addr, replicas)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	clusterOnce  sync.Once
	clusterAddrs []string
	clusterErr   string
)

// clusterNodes is a 3-primary cluster with the module on Redis 7.0.
func clusterNodes(t testing.TB) []string {
	clusterOnce.Do(func() {
		binary := configs()[0].binary
		ctx := context.Background()
		var addrs []string
		for n := 0; n < 3; n++ {
			addrs = append(addrs, startServer(t, binary, true, true))
		}
		ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
		for n, addr := range addrs {
			c := redis.NewClient(&redis.Options{Addr: addr})
			if err := c.ClusterAddSlotsRange(ctx, ranges[n][0], ranges[n][1]).Err(); err != nil {
				clusterErr = err.Error()
			}
			if n > 0 {
				host, port, _ := net.SplitHostPort(addrs[0])
				if err := c.ClusterMeet(ctx, host, port).Err(); err != nil {
					clusterErr = err.Error()
				}
			}
			c.Close()
		}
		deadline := time.Now().Add(30 * time.Second)
		for _, addr := range addrs {
			c := redis.NewClient(&redis.Options{Addr: addr})
			for {
				info, _ := c.ClusterInfo(ctx).Result()
				if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
					break
				}
				if time.Now().After(deadline) {
					clusterErr = "the cluster did not form: " + info
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			c.Close()
		}
		clusterAddrs = addrs
	})
	if clusterErr != "" {
		t.Fatal(clusterErr)
	}
	return clusterAddrs
}

func TestMain(m *testing.M) {
	if os.Getenv("IDEM_TEST_WORKER") != "" {
		runWorker()
		return
	}
	redis.SetLogger(quiet{})
	// The Example functions use the Redis 7.0 server with the module.
	addr, err := start(configs()[0].binary, true, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	exampleAddr, servers[configs()[0].name] = addr, addr
	code := m.Run()
	stopServers()
	os.Exit(code)
}

// quiet keeps go-redis's log lines (a Sentinel's switches) out of the
// tests' output.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
