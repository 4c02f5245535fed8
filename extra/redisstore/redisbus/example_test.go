package redisbus_test

import (
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisbus"
	"github.com/guardrail-go/guardrail/fleet"
)

// Every process of the fleet shares the pauses its dependency asks for
// through Redis: a Retry-After one process is given holds back the calls
// of all of them.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	bus, err := redisbus.New(redisbus.Config{Client: client, Channel: "checkout:hints"})
	if err != nil {
		log.Fatal(err)
	}
	hints, err := fleet.NewHints(fleet.HintsConfig{Bus: bus, Dependencies: []string{"payments"}})
	if err != nil {
		log.Fatal(err)
	}
	defer hints.Close()
	payments := &guardrail.Policy{Name: "payments", Retry: guardrail.Retry{Pauses: hints}}
	_ = payments // guardrail.Do(ctx, payments, op)
}

// The wire format of a hint.
func ExampleEncode() {
	h := fleet.Hint{Dependency: "payments", Kind: fleet.HintPause, At: time.UnixMilli(1764810000123), For: 10 * time.Second, Origin: "9f86d081884c7d65"}
	fmt.Println(string(redisbus.Encode(h)))
	// Output: {"v":1,"d":"payments","k":1,"at":1764810000123,"ms":10000,"o":"9f86d081884c7d65"}
}
