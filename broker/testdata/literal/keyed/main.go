// Command keyed compiles: the keyed form of unkeyed (see
// TestAcquireOptionsKeyedOnly).
package main

import (
	"context"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
)

func main() {
	b, _ := broker.Connect("127.0.0.1:5225")
	b.Acquire(context.Background(), "k", broker.AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second})
}
