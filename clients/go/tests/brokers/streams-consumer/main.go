// The go-streams consumer of brokers/scenario.py: idemstreams on the
// records' own server.
package main

import (
	"context"
	"log"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemstreams"
	"github.com/redis-idem/redis-idem/clients/go/tests/brokers/scenario"
	"github.com/redis/go-redis/v9"
)

func main() {
	env := scenario.Load()
	ctx := scenario.UntilTerm()
	c := idemstreams.New(env.Idem(), env.Source, env.Group, "member-"+env.Member,
		func(ctx context.Context, job *idem.Job, entry redis.XMessage) (scenario.Result, error) {
			body, _ := entry.Values["body"].(string)
			return env.Work(ctx, job, []byte(body))
		}, // One entry at a time: the scenario watches what each member is
		// at work on.
		idemstreams.Options{Concurrency: 1, OnError: func(err error) { log.Print(err) }})
	if err := c.Run(ctx); err != nil {
		log.Print(err)
	}
	log.Printf("member %s: %+v", env.Member, c.Stats())
}
