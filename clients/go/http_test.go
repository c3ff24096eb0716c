package idem_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
)

// httpHarness serves the case's requests through the middleware over real
// HTTP; each request names its step's handler and middleware options.
type httpHarness struct {
	srv      *httptest.Server
	mu       sync.Mutex
	steps    map[string]http.Handler
	runs     atomic.Int64
	finished atomic.Int64
	n        atomic.Int64
}

type httpOutcome struct {
	status        int
	replayed      bool
	body          string
	retryAfter    bool
	clientTimeout bool
	err           error
}

func newHTTPHarness(t *testing.T, r *runner) *httpHarness {
	h := &httpHarness{steps: map[string]http.Handler{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.mu.Lock()
		next := h.steps[req.Header.Get("X-Step")]
		h.mu.Unlock()
		next.ServeHTTP(w, req)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (r *runner) handler(spec map[string]any) http.Handler {
	h := r.http
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.runs.Add(1)
		defer h.finished.Add(1)
		if g, ok := spec["gate"].(string); ok {
			<-r.gate(g)
		}
		if d, ok := spec["sleep_ms"]; ok {
			time.Sleep(ms(d))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(spec["status"].(float64)))
		io.WriteString(w, spec["body"].(string))
	})
}

func (r *runner) request(s map[string]any) *bgCall {
	h := r.http
	id := "s" + string(rune('a'+h.n.Add(1)))
	opts := idem.MiddlewareOptions{}
	if o, ok := s["options"].(map[string]any); ok {
		for k, v := range o {
			if k != "wait_ms" {
				r.t.Fatalf("unknown middleware option %s", k)
			}
			opts.Wait = ms(v)
			if opts.Wait == 0 {
				opts.Wait = idem.Off
			}
		}
	}
	mw, err := r.i.Middleware(opts)
	if err != nil {
		r.t.Fatal(err)
	}
	h.mu.Lock()
	h.steps[id] = mw.Handler(r.handler(s["handler"].(map[string]any)))
	h.mu.Unlock()
	req, err := http.NewRequest(s["method"].(string), h.srv.URL+s["target"].(string), strings.NewReader(s["body"].(string)))
	if err != nil {
		r.t.Fatal(err)
	}
	for k, v := range s["headers"].(map[string]any) {
		req.Header.Set(k, v.(string))
	}
	req.Header.Set("X-Step", id)
	client := &http.Client{}
	if d, ok := s["client_timeout_ms"]; ok {
		client.Timeout = ms(d)
	}
	call := &bgCall{done: make(chan struct{}), http: &httpOutcome{}}
	go func() {
		defer close(call.done)
		resp, err := client.Do(req)
		out := call.http
		if err != nil {
			var ne net.Error
			out.err, out.clientTimeout = err, errors.As(err, &ne) && ne.Timeout()
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		out.status, out.body = resp.StatusCode, string(body)
		out.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		out.retryAfter = resp.Header.Get("Retry-After") != ""
	}()
	return call
}

func (r *runner) checkHTTP(at string, e map[string]any, c *bgCall) {
	o := c.http
	if o.err != nil && e["client_timeout"] != true {
		r.t.Fatalf("%s: %v", at, o.err)
	}
	for k, want := range e {
		var got any
		switch k {
		case "status":
			got = float64(o.status)
		case "replayed":
			got = o.replayed
		case "body":
			got = o.body
		case "retry_after":
			got = o.retryAfter
		case "client_timeout":
			got = o.clientTimeout
		case "handler_runs":
			got = float64(r.http.runs.Load())
		default:
			r.t.Fatalf("%s: unknown expectation %s", at, k)
		}
		if got != want {
			r.t.Errorf("%s: %s = %v, want %v", at, k, got, want)
		}
	}
}

func (r *runner) httpStep(at string, s map[string]any) {
	switch s["op"] {
	case "http":
		c := r.request(s)
		waitFor(r.t, at, c.done)
		r.checkHTTP(at, s["expect"].(map[string]any), c)
	case "http_start":
		r.mu.Lock()
		r.calls[s["id"].(string)] = r.request(s)
		r.mu.Unlock()
	case "http_finish":
		c := r.bg(s["id"])
		waitFor(r.t, at, c.done)
		r.checkHTTP(at, s["expect"].(map[string]any), c)
	case "handler_finished":
		want := int64(s["count"].(float64))
		deadline := time.Now().Add(20 * time.Second)
		for r.http.finished.Load() < want {
			if time.Now().After(deadline) {
				r.t.Fatalf("%s: the handler finished %d times", at, r.http.finished.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	case "fingerprint":
		got := idem.Fingerprint(s["method"].(string), s["target"].(string), []byte(s["body"].(string)))
		if got != s["expect"] {
			r.t.Errorf("%s: fingerprint %s, want %v", at, got, s["expect"])
		}
	}
}
