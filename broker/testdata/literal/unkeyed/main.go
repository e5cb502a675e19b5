// Command unkeyed must not compile: AcquireOptions takes keyed literals
// only (see TestAcquireOptionsKeyedOnly).
package main

import (
	"context"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
)

func main() {
	b, _ := broker.Connect("127.0.0.1:5225")
	// wait 5 s, lease 30 s: in the order of the fields, but unnamed.
	b.Acquire(context.Background(), "k", broker.AcquireOptions{30 * time.Second, 5 * time.Second, 0})
}
