package connlimit

import (
	"sync"
	"time"
)

// Limiter runs at most one log call per interval and counts the calls it
// suppressed in between, for failures a stranger can provoke at will.
type Limiter struct {
	every      time.Duration
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// NewLimiter returns a Limiter of one call per every.
func NewLimiter(every time.Duration) *Limiter { return &Limiter{every: every} }

// Do calls f, outside the limiter's lock, with the number of calls
// suppressed since the last one that ran, unless one ran within the
// interval.
func (l *Limiter) Do(f func(suppressed int)) {
	l.mu.Lock()
	t := time.Now()
	if !l.last.IsZero() && t.Sub(l.last) < l.every {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = t, 0
	l.mu.Unlock()
	f(n)
}
