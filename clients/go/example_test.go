package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// exampleAddr is a server with the module, started by TestMain.

func ExampleProcess() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer client.Close()
	consumer, err := idem.New(client, idem.Options{Prefix: "example-process:"})
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context, job *idem.Job) (map[string]int, error) {
		// ctx is cancelled if the lease is lost; job.Attempt() fences writes.
		return map[string]int{"charged": 1250}, nil
	}
	first, err := idem.Process(ctx, consumer, "order:1", charge)
	fmt.Println(first.Value, first.Replayed, first.Status, first.Attempt, err)
	// A redelivery: the stored result, the work does not run.
	again, err := idem.Process(ctx, consumer, "order:1", charge)
	fmt.Println(again.Value, again.Replayed, err)
	fmt.Printf("%+v\n", consumer.Stats())
	// Output:
	// map[charged:1250] false NEW 1 <nil>
	// map[charged:1250] true <nil>
	// {FirstRuns:1 Retries:0 Replays:1 Waits:0 Busy:0 Completed:1 Released:0 LeasesLost:0 ResultsDropped:0 Mismatches:0 Exhausted:0 Extends:0 NotDurable:0}
}

func ExampleProcessMany() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer client.Close()
	consumer, _ := idem.New(client, idem.Options{Prefix: "example-many:"})
	// One hash tag: one IDEM.MCLAIM and one IDEM.MDONE for the batch, in a
	// cluster too.
	keys := []string{"{orders}:1", "{orders}:2", "{orders}:3"}
	items, err := idem.ProcessMany(ctx, consumer, keys, func(ctx context.Context, job *idem.Job) (string, error) {
		if job.Key() == "{orders}:2" {
			return "", fmt.Errorf("card declined")
		}
		return "shipped " + job.Key(), nil
	})
	for _, it := range items {
		fmt.Println(it.Key, it.Status, it.Value, it.Err)
	}
	fmt.Println(err)
	// Output:
	// {orders}:1 processed shipped {orders}:1 <nil>
	// {orders}:2 failed  card declined
	// {orders}:3 processed shipped {orders}:3 <nil>
	// <nil>
}

func ExampleIdem_Middleware() {
	client := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer client.Close()
	service, _ := idem.New(client, idem.Options{Prefix: "example-http:"})
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	})
	mw, err := service.Middleware(idem.MiddlewareOptions{Scope: "orders"})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mw.Handler(orders))
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"amount":1250}`))
		req.Header.Set("Idempotency-Key", "7f3c")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	}
	// Output:
	// 201  {"id":1}
	// 201 true {"id":1}
}

func ExampleFingerprint() {
	fmt.Println(idem.Fingerprint("POST", "/orders?src=test", []byte(`{"amount":1250}`)))
	// Output: 81f052817fb9831777be317dde45e13d01b9c96fc701b1260eec3583288a4e0e
}
