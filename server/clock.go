package server

import "time"

// clock is the scheduler's monotonic clock: lease ends, wait deadlines and
// their timers. The default (a nil Server.clk) is the process's monotonic
// clock with time.AfterFunc; tests inject a fake one (Config.clock) to
// place a lease's end exactly. The branch on nil keeps the default free of
// an indirect call on the grant path.
type clock interface {
	now() int64 // nanoseconds since an arbitrary origin; never goes back
	afterFunc(d time.Duration, f func()) timer
}

// timer is what the scheduler needs of a *time.Timer.
type timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// now is the server's monotonic clock in nanoseconds.
func (s *Server) now() int64 {
	if s.clk != nil {
		return s.clk.now()
	}
	return int64(time.Since(s.epoch))
}

// afterFunc runs f in its own goroutine after d on the server's clock.
func (s *Server) afterFunc(d time.Duration, f func()) timer {
	if s.clk != nil {
		return s.clk.afterFunc(d, f)
	}
	return time.AfterFunc(d, f)
}
