// Package redisbus carries fleet hints (package fleet of guardrail) on
// Redis pub/sub: a Bus publishes each hint on one channel, and every
// process subscribed to it receives it.
//
// Pub/sub keeps nothing: a process that is not connected when a hint is
// published misses it, which hints are built for (they are advisory, and
// a pause expires by itself). go-redis reconnects and resubscribes a lost
// subscription on its own, and pings it when it is quiet, so a
// subscription that was lost without an error comes back within seconds.
//
// A hint is a small JSON object:
//
//	{"v":1,"d":"payments","k":1,"at":1764810000123,"ms":10000,"o":"9f86d081884c7d65"}
//
// v is the format's version, d the dependency, k the kind (1 pause, 2
// breaker opened), at the publisher's time in Unix milliseconds, ms the
// pause in milliseconds and o the publisher's origin. A message that is not
// such an object, or holds values out of range, is ignored.
package redisbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/fleet"
)

// DefaultChannel is the pub/sub channel of a zero Config.Channel.
const DefaultChannel = "guardrail:hints"

// Bounds of a hint on the wire: a message longer than MaxMessage bytes, or
// whose names are longer than these, is ignored. A pause longer than a
// day is too: no receiver would honour it (fleet.HintsConfig.MaxPause
// caps pauses far below).
const (
	MaxMessage    = 1024
	maxDependency = 256
	maxOrigin     = 64
	maxFor        = 24 * time.Hour
)

// ErrInvalidConfig is the sentinel of every error New returns for a
// Config it rejects; the error names the field.
var ErrInvalidConfig = errors.New("redisbus: invalid config")

// Config configures a Bus: a plain value that New copies.
type Config struct {
	// Client is the Redis client the Bus publishes and subscribes with: a
	// *redis.Client, a *redis.ClusterClient (pub/sub reaches every node)
	// or a *redis.Ring. Required. Subscribing takes one connection of its
	// own for as long as the subscription lasts.
	Client redis.UniversalClient

	// Channel is the pub/sub channel: processes that share hints must use
	// the same one, and fleets that must not, different ones. Zero means
	// DefaultChannel.
	Channel string
}

// Bus is a fleet.Bus on Redis pub/sub. It is safe for concurrent use.
type Bus struct {
	client  redis.UniversalClient
	channel string
}

var _ fleet.Bus = (*Bus)(nil)

// New returns a Bus configured by cfg, or an error that Is
// ErrInvalidConfig when cfg.Client is nil. It does not contact Redis.
func New(cfg Config) (*Bus, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: Config.Client is nil; want a Redis client", ErrInvalidConfig)
	}
	b := &Bus{client: cfg.Client, channel: cfg.Channel}
	if b.channel == "" {
		b.channel = DefaultChannel
	}
	return b, nil
}

// Channel returns the pub/sub channel the Bus uses.
func (b *Bus) Channel() string { return b.channel }

// Publish sends h on the channel. It returns Redis's error, or ctx's.
func (b *Bus) Publish(ctx context.Context, h fleet.Hint) error {
	return b.client.Publish(ctx, b.channel, Encode(h)).Err()
}

// Subscribe subscribes to the channel and returns once Redis confirmed
// it, or with an error when it could not before ctx ended. deliver then
// receives every valid hint published on the channel, on one goroutine;
// messages that do not decode are dropped. stop closes the subscription
// and returns once deliver has returned for the last time.
func (b *Bus) Subscribe(ctx context.Context, deliver func(fleet.Hint)) (stop func(), err error) {
	ps := b.client.Subscribe(ctx, b.channel)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return nil, err
	}
	msgs := ps.Channel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			if h, ok := Decode([]byte(m.Payload)); ok {
				deliver(h)
			}
		}
	}()
	return func() {
		ps.Close()
		<-done
	}, nil
}

// wire is a hint on the wire.
type wire struct {
	V  int    `json:"v"`
	D  string `json:"d"`
	K  uint8  `json:"k"`
	At int64  `json:"at,omitempty"`
	Ms int64  `json:"ms"`
	O  string `json:"o,omitempty"`
}

// Encode returns h as the JSON object described in the package's
// documentation. For is rounded up to the millisecond.
func Encode(h fleet.Hint) []byte {
	w := wire{V: 1, D: h.Dependency, K: uint8(h.Kind), Ms: int64((h.For + time.Millisecond - 1) / time.Millisecond), O: h.Origin}
	if !h.At.IsZero() {
		w.At = h.At.UnixMilli()
	}
	data, _ := json.Marshal(w) // a struct of strings and numbers cannot fail
	return data
}

// Decode returns the hint data encodes, and false when data is not a hint
// of version 1 within the bounds: a message of at most MaxMessage bytes,
// a dependency of 1 to 256 bytes, an origin of at most 64, a known kind,
// a pause of 1 ms to 24 h and a time that is not negative. Unknown fields
// are ignored, for versions to come.
func Decode(data []byte) (fleet.Hint, bool) {
	if len(data) > MaxMessage {
		return fleet.Hint{}, false
	}
	var w wire
	if err := json.Unmarshal(data, &w); err != nil {
		return fleet.Hint{}, false
	}
	kind := fleet.HintKind(w.K)
	switch {
	case w.V != 1,
		w.D == "" || len(w.D) > maxDependency,
		len(w.O) > maxOrigin,
		kind != fleet.HintPause && kind != fleet.HintBreakerOpen,
		w.Ms <= 0 || w.Ms > int64(maxFor/time.Millisecond),
		w.At < 0 || w.At > 1<<53:
		return fleet.Hint{}, false
	}
	h := fleet.Hint{Dependency: w.D, Kind: kind, For: time.Duration(w.Ms) * time.Millisecond, Origin: w.O}
	if w.At > 0 {
		h.At = time.UnixMilli(w.At)
	}
	return h, true
}
