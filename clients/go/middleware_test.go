package idem_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

func post(t *testing.T, url, key, body string) (*http.Response, string) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The stored response is the format every language's middleware reads.
func TestMiddlewareStoresTheSharedFormat(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		i := newIdem(t, addr, idem.Options{Prefix: fresh("mw")})
		var runs atomic.Int64
		mw, err := i.Middleware(idem.MiddlewareOptions{Scope: "orders", Required: true, MaxTries: 2})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if r.Method == "POST" && strings.Contains(r.URL.Path, "fail") {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Add("X-Trace", "a")
			w.Header().Add("X-Trace", "b")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":1}`)
		})))
		defer srv.Close()
		if resp, _ := post(t, srv.URL+"/orders", "", "{}"); resp.StatusCode != 400 {
			t.Errorf("without the header: %d, want 400", resp.StatusCode)
		}
		if resp, err := http.Get(srv.URL + "/orders"); err != nil || resp.StatusCode != 201 || runs.Load() != 1 {
			t.Errorf("a GET passes through: %v %v", resp, err)
		}
		post(t, srv.URL+"/orders", "k1", `{"a":1}`)
		rec, err := i.Get(context.Background(), "http:orders:k1")
		if err != nil || rec == nil || rec.State != idem.StateDone {
			t.Fatalf("the record: %+v %v", rec, err)
		}
		var stored map[string]any
		if err := json.Unmarshal(rec.Result, &stored); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"v": 1.0, "status": 201.0, "body": base64.StdEncoding.EncodeToString([]byte(`{"id":1}`)),
			"headers": []any{[]any{"content-type", "application/json"}, []any{"x-trace", "a"}, []any{"x-trace", "b"}}}
		if !jsonEqual(stored, want) {
			t.Errorf("stored %s, want %v", rec.Result, want)
		}
		resp, body := post(t, srv.URL+"/orders", "k1", `{"a":1}`)
		if resp.StatusCode != 201 || body != `{"id":1}` || resp.Header.Get("Idempotent-Replayed") != "true" ||
			strings.Join(resp.Header.Values("X-Trace"), ",") != "a,b" || runs.Load() != 2 {
			t.Errorf("the replay: %d %q %v", resp.StatusCode, body, resp.Header)
		}
		for n, want := range []int{502, 502, 500} {
			if resp, _ := post(t, srv.URL+"/fail", "k2", "{}"); resp.StatusCode != want {
				t.Errorf("failure %d: %d, want %d", n+1, resp.StatusCode, want)
			}
		}
		if s := mw.Stats(); s.Released != 2 || s.Exhausted != 1 || s.Replays != 1 || s.FirstRuns != 2 {
			t.Errorf("the middleware's stats %+v", s)
		}
	})
}

// DONE's reply lost and no retries allowed: DoneUnconfirmed carrying the
// result; the server did complete it, so the redelivery replays.
func TestDoneUnconfirmed(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		p := startProxy(t, addr)
		client := redis.NewClient(&redis.Options{Addr: p.addr()})
		defer client.Close()
		i, _ := idem.New(client, idem.Options{Prefix: fresh("unconfirmed"), DoneRetries: -1})
		p.cut("done", false, 1)
		work := func(context.Context, *idem.Job) (string, error) { return "v", nil }
		_, err := idem.Process(context.Background(), i, "k", work)
		var unconfirmed *idem.DoneUnconfirmedError
		if !errors.As(err, &unconfirmed) || unconfirmed.Result != "v" {
			t.Fatalf("%v, want a *DoneUnconfirmedError with the result", err)
		}
		res, err := idem.Process(context.Background(), i, "k", work)
		if err != nil || !res.Replayed || res.Value != "v" {
			t.Errorf("the redelivery: %+v %v", res, err)
		}
	})
}

// The middleware takes the Idem's settings unless its own options set
// them: here Wait off (a repeat in flight is 409 at once, not after a
// wait), MaxTries 2 (the third failure is 500), the Owner of its claims.
func TestMiddlewareTakesTheIdemsSettings(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		i := newIdem(t, addr, idem.Options{Prefix: fresh("mw-settings"), Wait: idem.Off, MaxTries: 2, Owner: "svc-a:1"})
		mw, err := i.Middleware(idem.MiddlewareOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "fail") {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			<-gate
			w.WriteHeader(http.StatusCreated)
		})))
		defer srv.Close()
		first := make(chan int)
		go func() {
			resp, _ := post(t, srv.URL+"/orders", "k", "{}")
			first <- resp.StatusCode
		}()
		deadline := time.Now().Add(10 * time.Second)
		for {
			rec, err := i.Get(context.Background(), "http:k")
			if err == nil && rec != nil {
				if rec.Owner != "svc-a:1" {
					t.Errorf("the claim's owner %q, want the Idem's", rec.Owner)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the first request did not claim")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if resp, _ := post(t, srv.URL+"/orders", "k", "{}"); resp.StatusCode != http.StatusConflict {
			t.Errorf("a repeat in flight: %d, want 409 at once", resp.StatusCode)
		}
		close(gate)
		if code := <-first; code != http.StatusCreated {
			t.Errorf("the first: %d", code)
		}
		for n, want := range []int{503, 503, 500} {
			if resp, _ := post(t, srv.URL+"/fail", "f", "{}"); resp.StatusCode != want {
				t.Errorf("failure %d: %d, want %d", n+1, resp.StatusCode, want)
			}
		}
		if s := mw.Stats(); s.Waits != 0 || s.Busy != 1 || s.Exhausted != 1 {
			t.Errorf("the middleware's stats %+v", s)
		}
	})
}

// durable on a primary without replicas: a repeat whose read of the
// stored response was not acknowledged gets that response with
// Idempotent-Replayed: true, as any replay; one with none kept is 503.
// The handler never runs.
func TestMiddlewareReplayNotDurable(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		i := newIdem(t, addr, idem.Options{Prefix: fresh("mw-durable"), Durable: &idem.Durable{Replicas: 1, Timeout: 50 * time.Millisecond}})
		mw, err := i.Middleware(idem.MiddlewareOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})))
		defer srv.Close()
		stored := `{"v":1,"status":202,"headers":[],"body":"` + base64.StdEncoding.EncodeToString([]byte("stored")) + `"}`
		for key, result := range map[string][]byte{"http:a": []byte(stored), "http:b": nil} {
			c, err := i.Claim(ctx, key, time.Minute, idem.ClaimArgs{Payload: []byte(idem.Fingerprint("POST", "/orders", []byte("{}")))})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := i.Done(ctx, key, c.Token, idem.DoneArgs{Result: result}); err != nil {
				t.Fatal(err)
			}
		}
		resp, body := post(t, srv.URL+"/orders", "a", "{}")
		if resp.StatusCode != 202 || body != "stored" || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("a replay not acknowledged: %d %q %v", resp.StatusCode, body, resp.Header)
		}
		if resp, _ := post(t, srv.URL+"/orders", "b", "{}"); resp.StatusCode != 503 {
			t.Errorf("a replay not acknowledged, none kept: %d, want 503", resp.StatusCode)
		}
		if s := mw.Stats(); runs.Load() != 0 || s.NotDurable != 2 {
			t.Errorf("runs %d, stats %+v: want the handler never run, two not durable", runs.Load(), s)
		}
	})
}
