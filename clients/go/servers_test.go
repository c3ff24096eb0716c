package idem_test

// Real servers for the tests, on free 127.0.0.1 ports: the module on
// Redis 7.0 (REDIS_SERVER, default redis-server), Redis 8.2
// (REDIS8_SERVER) and Valkey 9.1 (VALKEY_SERVER); the Functions edition
// (functions/idem.lua, no module) on Redis 7.0 and Valkey 9.1; a 3-node
// cluster with the module on Redis 7.0. REDIS_IDEM_MODULE is the module
// (default ../../target/release/libredis_idem.so).

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
func startServer(t testing.TB, binary string, module bool, extra ...string) string {
	t.Helper()
	addr, err := start(binary, module, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func start(binary string, module bool, extra ...string) (string, error) {
	if _, err := os.Stat(modulePath()); module && err != nil {
		return "", fmt.Errorf("the module is missing (set REDIS_IDEM_MODULE): %v", err)
	}
	port, err := freePort(len(extra) > 0)
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
	args = append(args, "--logfile", filepath.Join(dir, "server.log"))
	cmd := exec.Command(binary, append(args, extra...)...)
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
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			return "", fmt.Errorf("%s did not start on %s:\n%s", binary, addr, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, nil
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
	addr := startServer(t, cfg.binary, cfg.edition == "module")
	if cfg.edition == "functions" {
		loadFunctions(t, addr)
	}
	servers[cfg.name] = addr
	return addr
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
			addrs = append(addrs, startServer(t, binary, true, "--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"))
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
	// The Example functions use the Redis 7.0 server with the module.
	addr, err := start(configs()[0].binary, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	exampleAddr, servers[configs()[0].name] = addr, addr
	code := m.Run()
	stopServers()
	os.Exit(code)
}
