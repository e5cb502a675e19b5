package raftnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// levelTrace is the slog level of hclog's Trace, below slog.LevelDebug.
const levelTrace = slog.LevelDebug - 4

// HCLogger returns an hclog.Logger, the logger type of hashicorp/raft
// (raft.Config.Logger, raft.NetworkTransportConfig.Logger), that writes to
// l. The handler of l decides which levels are written: SetLevel is a
// no-op. Named loggers add a "logger" attribute with the dotted name. A nil l
// discards everything.
//
// Raft's lines about a peer it cannot reach, which it logs on every
// attempt (a leader with a dead peer: "failed to appendEntries to" and
// "failed to heartbeat to", several a second), are rate-limited per
// message and peer: one line per RepeatEvery, with "suppressed", the
// number of lines like it not written since the previous one (0 on the
// first). The logger and the loggers derived from it (Named, With) share
// the limit.
func HCLogger(l *slog.Logger) hclog.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return newHCAdapter(l, "", nil, newRepeatLimiter(time.Now))
}

// RepeatEvery is how often HCLogger writes a rate-limited line for one
// peer (see HCLogger).
const RepeatEvery = 30 * time.Second

// limitedMsgs are raft's messages that repeat for every attempt at an
// unreachable peer, with the argument that names the peer.
var limitedMsgs = map[string]string{
	"failed to appendEntries to":              "peer",
	"failed to heartbeat to":                  "peer",
	"failed to start pipeline replication to": "peer",
	"failed to pipeline appendEntries":        "peer",
	"failed to make requestVote RPC":          "target",
	"failed to contact":                       "server-id",
}

// repeatLimiter counts the lines of limitedMsgs per message and peer.
type repeatLimiter struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]*repeatState // message + "\x00" + peer
}

type repeatState struct {
	last       time.Time // the latest line written
	suppressed int       // lines not written since
}

func newRepeatLimiter(now func() time.Time) *repeatLimiter {
	return &repeatLimiter{now: now, m: map[string]*repeatState{}}
}

// allow reports whether a line of key is written now and, if so, how many
// were suppressed since the previous one.
func (l *repeatLimiter) allow(key string) (bool, int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.m[key]
	if st == nil {
		if len(l.m) >= maxRepeatKeys { // peers come and go: forget the quiet ones
			for k, v := range l.m {
				if now.Sub(v.last) >= RepeatEvery {
					delete(l.m, k)
				}
			}
		}
		if len(l.m) >= maxRepeatKeys {
			return true, 0 // too many at once: write rather than lose count
		}
		l.m[key] = &repeatState{last: now}
		return true, 0
	}
	if now.Sub(st.last) < RepeatEvery {
		st.suppressed++
		return false, 0
	}
	n := st.suppressed
	st.last, st.suppressed = now, 0
	return true, n
}

// maxRepeatKeys bounds the limiter's table.
const maxRepeatKeys = 1024

// limitKey is the limiter's key of a line, or "" if it is not limited.
func limitKey(msg string, args []any) string {
	name, ok := limitedMsgs[msg]
	if !ok {
		return ""
	}
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == name {
			return msg + "\x00" + fmt.Sprint(args[i+1])
		}
	}
	return msg + "\x00"
}

// hcAdapter writes to out: base with the attribute "logger" (the name, if
// any) and then the implied arguments.
type hcAdapter struct {
	base    *slog.Logger
	out     *slog.Logger
	name    string
	implied []any
	limit   *repeatLimiter
}

func newHCAdapter(base *slog.Logger, name string, implied []any, limit *repeatLimiter) *hcAdapter {
	out := base
	if name != "" {
		out = out.With("logger", name)
	}
	if len(implied) > 0 {
		out = out.With(implied...)
	}
	return &hcAdapter{base: base, out: out, name: name, implied: implied, limit: limit}
}

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return levelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (a *hcAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	lvl := slogLevel(routineLevel(level, msg, args))
	if !a.out.Enabled(context.Background(), lvl) {
		return
	}
	if key := limitKey(msg, args); key != "" {
		ok, n := a.limit.allow(key)
		if !ok {
			return
		}
		args = append(args[:len(args):len(args)], "suppressed", n)
	}
	for i, v := range args {
		// hclog.Fmt values ("servers", hclog.Fmt("%+v", ...)) are a format
		// and its arguments: render them as hclog would.
		if f, ok := v.(hclog.Format); ok && len(f) > 0 {
			if format, ok := f[0].(string); ok {
				args[i] = fmt.Sprintf(format, f[1:]...)
			}
		}
	}
	a.out.Log(context.Background(), lvl, msg, args...)
}

// routineLevel is the level of a raft line: level, lowered for the lines
// raft writes at Warn or Error in routine cases, which are not a problem
// to look into:
//   - "heartbeat timeout reached, starting election" with no last leader
//     (last-leader-id empty): the first election of a node that has not
//     yet heard from a leader, at bootstrap or at a start, is Info; the
//     same line after a leader was known (the leader was lost) stays Warn;
//   - "failed to decode incoming command" and "failed to flush response"
//     whose error is net.ErrClosed ("use of closed network connection"):
//     the node's own transport closing its connections as it shuts down
//     (a graceful stop or restart) is Debug; any other error stays Error.
func routineLevel(level hclog.Level, msg string, args []any) hclog.Level {
	switch msg {
	case "heartbeat timeout reached, starting election":
		if level == hclog.Warn && argString(args, "last-leader-id") == "" && argString(args, "last-leader-addr") == "" {
			return hclog.Info
		}
	case "failed to decode incoming command", "failed to flush response":
		if err, _ := argValue(args, "error").(error); level == hclog.Error && errors.Is(err, net.ErrClosed) {
			return hclog.Debug
		}
	}
	return level
}

// argValue is the value of the key/value argument named key, or nil.
func argValue(args []any, key string) any {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == key {
			return args[i+1]
		}
	}
	return nil
}

// argString is argValue as a string ("" if absent).
func argString(args []any, key string) string {
	v := argValue(args, key)
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func (a *hcAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hcAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hcAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hcAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hcAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hcAdapter) enabled(l slog.Level) bool { return a.out.Enabled(context.Background(), l) }
func (a *hcAdapter) IsTrace() bool             { return a.enabled(levelTrace) }
func (a *hcAdapter) IsDebug() bool             { return a.enabled(slog.LevelDebug) }
func (a *hcAdapter) IsInfo() bool              { return a.enabled(slog.LevelInfo) }
func (a *hcAdapter) IsWarn() bool              { return a.enabled(slog.LevelWarn) }
func (a *hcAdapter) IsError() bool             { return a.enabled(slog.LevelError) }

func (a *hcAdapter) ImpliedArgs() []any { return a.implied }

func (a *hcAdapter) With(args ...any) hclog.Logger {
	return newHCAdapter(a.base, a.name, append(a.implied[:len(a.implied):len(a.implied)], args...), a.limit)
}

func (a *hcAdapter) Name() string { return a.name }

func (a *hcAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

// ResetNamed keeps the implied arguments.
func (a *hcAdapter) ResetNamed(name string) hclog.Logger {
	return newHCAdapter(a.base, name, a.implied, a.limit)
}

// SetLevel is a no-op: the slog handler decides.
func (a *hcAdapter) SetLevel(hclog.Level) {}

// GetLevel returns the lowest level the slog handler writes.
func (a *hcAdapter) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if a.enabled(slogLevel(l)) {
			return l
		}
	}
	return hclog.Off
}

func (a *hcAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	level := slog.LevelInfo
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = slogLevel(opts.ForceLevel)
	}
	return slog.NewLogLogger(a.out.Handler(), level)
}

func (a *hcAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return a.StandardLogger(opts).Writer()
}
