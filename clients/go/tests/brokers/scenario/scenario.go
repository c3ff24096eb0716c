// Package scenario is what the four consumer programs share: their
// settings from the environment brokers/scenario.py gives, and the work
// of brokers/README.md ("Writing a consumer program") on the side store.
package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// Env is the scenario's settings for one member.
type Env struct {
	Adapter, Source, Group, Member string
	Broker                         map[string]any
	idem                           *idem.Idem
	side                           *redis.Client
	startSHA, effectSHA            string
	work, slow                     time.Duration
}

// Load reads the environment and makes the Idem (IDEM_LEASE_S,
// IDEM_MAX_TRIES, the rest at their defaults).
func Load() *Env {
	e := &Env{Adapter: os.Getenv("IDEM_ADAPTER"), Source: os.Getenv("IDEM_SOURCE"), Group: os.Getenv("IDEM_GROUP"),
		Member: os.Getenv("IDEM_MEMBER"), startSHA: os.Getenv("SIDE_START_SHA"), effectSHA: os.Getenv("SIDE_EFFECT_SHA"),
		work: millis("IDEM_WORK_MS"), slow: millis("IDEM_SLOW_WORK_MS")}
	if err := json.Unmarshal([]byte(os.Getenv("BROKER")), &e.Broker); err != nil {
		log.Fatalf("BROKER: %v", err)
	}
	records, err := redis.ParseURL(os.Getenv("IDEM_REDIS_URL"))
	if err != nil {
		log.Fatalf("IDEM_REDIS_URL: %v", err)
	}
	side, err := redis.ParseURL(os.Getenv("SIDE_REDIS_URL"))
	if err != nil {
		log.Fatalf("SIDE_REDIS_URL: %v", err)
	}
	e.side = redis.NewClient(side)
	edition := idem.EditionModule
	if os.Getenv("IDEM_EDITION") == "functions" {
		edition = idem.EditionFunctions
	}
	lease, _ := strconv.Atoi(os.Getenv("IDEM_LEASE_S"))
	tries, _ := strconv.Atoi(os.Getenv("IDEM_MAX_TRIES"))
	e.idem, err = idem.New(redis.NewClient(records), idem.Options{Lease: time.Duration(lease) * time.Second,
		MaxTries: tries, Edition: edition})
	if err != nil {
		log.Fatal(err)
	}
	return e
}

func millis(name string) time.Duration {
	ms, _ := strconv.Atoi(os.Getenv(name))
	return time.Duration(ms) * time.Millisecond
}

// Idem is the member's Idem.
func (e *Env) Idem() *idem.Idem { return e.idem }

// BrokerString is one of BROKER's fields.
func (e *Env) BrokerString(field string) string {
	s, _ := e.Broker[field].(string)
	return s
}

// UntilTerm is a context that ends at SIGTERM (or SIGINT).
func UntilTerm() context.Context {
	ctx, _ := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	return ctx
}

// Message is a message's body.
type Message struct {
	Key     string `json:"key"`
	Account int    `json:"account"`
	Seq     int    `json:"seq"`
	Kind    string `json:"kind"`
}

// Result is the work's value, stored as the record's result.
type Result struct {
	N int `json:"n"`
}

var errFails = errors.New("the work fails (the side store said so)")

// Work is brokers/README.md's work for a message's body: start (which may
// say it fails), the work's time, then the effect fenced by the attempt,
// once the job's lease is known to hold still.
func (e *Env) Work(ctx context.Context, job *idem.Job, body []byte) (Result, error) {
	var m Message
	if err := json.Unmarshal(body, &m); err != nil {
		return Result{}, fmt.Errorf("the body: %w", err)
	}
	start, err := e.side.EvalSha(ctx, e.startSHA, []string{m.Key}, m.Kind, e.Member).Text()
	if err != nil {
		return Result{}, err
	}
	if start == "fail" {
		return Result{}, errFails
	}
	took := e.work
	if m.Kind == "slow" {
		took = e.slow
	}
	time.Sleep(took)
	// The side store fences a late write only once a later attempt wrote:
	// past its lease (this process was stopped) the effect is not written.
	if err := job.Check(); err != nil {
		return Result{}, err
	}
	err = e.side.EvalSha(context.WithoutCancel(ctx), e.effectSHA, []string{m.Key}, job.Attempt(), m.Account, m.Seq,
		e.Member).Err()
	return Result{N: m.Seq}, err
}
