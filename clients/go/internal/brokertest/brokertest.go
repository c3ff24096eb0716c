// Package brokertest starts what the broker adapters' tests run against:
// a Redis with the module or the Functions edition, and a real broker
// through brokers/launch.py (brokers/README.md), each on free ports under
// a temporary directory. REDIS_SERVER, REDIS_IDEM_MODULE and
// REDIS_IDEM_FUNCTIONS pick other builds, as the library's tests do.
package brokertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Root is the checkout's root (where functions/idem.lua is).
func Root() string {
	dir, _ := os.Getwd()
	for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "functions", "idem.lua")); err == nil {
			return d
		}
	}
	panic("brokertest: not inside a checkout of redis-idem")
}

var (
	mu      sync.Mutex
	stops   []func()
	brokers = map[string]map[string]any{}
)

// Stop ends every server and broker started (call it at the end of
// TestMain).
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	for n := len(stops) - 1; n >= 0; n-- {
		stops[n]()
	}
	stops = nil
	brokers = map[string]map[string]any{}
}

// Editions are the two editions a test runs on.
var Editions = []string{"module", "functions"}

// Redis starts a Redis with edition ("module" or "functions") for the test
// and answers its address.
func Redis(t testing.TB, edition string) string {
	t.Helper()
	for try := 1; ; try++ {
		addr, err := startRedis(t, edition)
		if err == nil {
			return addr
		}
		if try == 5 {
			t.Fatal(err)
		}
	}
}

// startRedis starts one redis-server on a port that was free a moment ago.
// Another suite's server can take the port first: ours then exits, and a
// PING alone would answer from theirs (a test once ran against a stranger's
// stream), so the server must report our process's pid.
func startRedis(t testing.TB, edition string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	binary := os.Getenv("REDIS_SERVER")
	if binary == "" {
		binary = "redis-server"
	}
	args := []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir()}
	if edition == "module" {
		module := os.Getenv("REDIS_IDEM_MODULE")
		if module == "" {
			module = filepath.Join(Root(), "target", "release", "libredis_idem.so")
		}
		args = append(args, "--loadmodule", module)
	}
	cmd := exec.Command(binary, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _, _ = cmd.Process.Wait(); close(exited) }()
	stop := func() { _ = cmd.Process.Kill(); <-exited }
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-exited:
			return "", fmt.Errorf("redis-server on %s exited at start (its port taken?)", addr)
		default:
		}
		if info, err := client.InfoMap(ctx, "server").Result(); err == nil {
			if info["Server"]["process_id"] == fmt.Sprint(cmd.Process.Pid) {
				break
			}
			stop()
			return "", fmt.Errorf("%s answers from another process: our redis-server could not take the port", addr)
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("redis-server on %s did not start", addr)
		}
	}
	t.Cleanup(stop)
	if edition == "functions" {
		path := os.Getenv("REDIS_IDEM_FUNCTIONS")
		if path == "" {
			path = filepath.Join(Root(), "functions", "idem.lua")
		}
		lua, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.FunctionLoadReplace(ctx, string(lua)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return addr, nil
}

// Broker starts broker ("kafka", "rabbitmq", "nats") once for the test
// binary (Stop ends it) and answers brokers/launch.py's JSON.
func Broker(t testing.TB, broker string) map[string]any {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if info, ok := brokers[broker]; ok {
		return info
	}
	dir, err := os.MkdirTemp("", "idem-go-"+broker+"-")
	if err != nil {
		t.Fatal(err)
	}
	launch := filepath.Join(Root(), "brokers", "launch.py")
	out, err := exec.Command("python3", launch, "start", broker, "--dir", dir).Output()
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("starting %s: %v", broker, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var info map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &info); err != nil {
		t.Fatalf("brokers/launch.py said %q: %v", out, err)
	}
	stops = append(stops, func() {
		_ = exec.Command("python3", launch, "stop", "--dir", dir).Run()
		os.RemoveAll(dir)
	})
	brokers[broker] = info
	return info
}

// Field is one of a broker's JSON fields.
func Field(info map[string]any, name string) string {
	s, _ := info[name].(string)
	return s
}

// Unique is a name no other test of this run uses.
func Unique(what string) string {
	mu.Lock()
	defer mu.Unlock()
	counter++
	return fmt.Sprintf("%s-%d-%d", what, os.Getpid(), counter)
}

var counter int

// Must ends the test on an error.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// WaitFor polls ok until it holds, or ends the test after a minute.
func WaitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Log is what the works saw, in order, from any goroutine.
type Log struct {
	mu   sync.Mutex
	what []string
}

// Add appends one.
func (l *Log) Add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.what = append(l.what, s)
}

// Snapshot is a copy of what was added so far.
func (l *Log) Snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.what)
}
