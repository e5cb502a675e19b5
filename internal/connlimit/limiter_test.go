package connlimit

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	l := NewLimiter(time.Hour)
	var ran []int
	for range 3 {
		l.Do(func(n int) { ran = append(ran, n) })
	}
	l.last = time.Now().Add(-2 * time.Hour) // the interval has passed
	l.Do(func(n int) { ran = append(ran, n) })
	if len(ran) != 2 || ran[0] != 0 || ran[1] != 2 {
		t.Fatalf("ran with suppressed counts %v, want [0 2]", ran)
	}
}
