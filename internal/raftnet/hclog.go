package raftnet

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// levelTrace is the slog level of hclog's Trace, below slog.LevelDebug.
const levelTrace = slog.LevelDebug - 4

// HCLogger returns an hclog.Logger, the logger type of hashicorp/raft
// (raft.Config.Logger, raft.NetworkTransportConfig.Logger), that writes to
// l. The handler of l decides which levels are written: SetLevel is a
// no-op. Named loggers add a "logger" attribute with the dotted name. A nil l
// discards everything.
func HCLogger(l *slog.Logger) hclog.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return newHCAdapter(l, "", nil)
}

// hcAdapter writes to out: base with the attribute "logger" (the name, if
// any) and then the implied arguments.
type hcAdapter struct {
	base    *slog.Logger
	out     *slog.Logger
	name    string
	implied []any
}

func newHCAdapter(base *slog.Logger, name string, implied []any) *hcAdapter {
	out := base
	if name != "" {
		out = out.With("logger", name)
	}
	if len(implied) > 0 {
		out = out.With(implied...)
	}
	return &hcAdapter{base: base, out: out, name: name, implied: implied}
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
	for i, v := range args {
		// hclog.Fmt values ("servers", hclog.Fmt("%+v", ...)) are a format
		// and its arguments: render them as hclog would.
		if f, ok := v.(hclog.Format); ok && len(f) > 0 {
			if format, ok := f[0].(string); ok {
				args[i] = fmt.Sprintf(format, f[1:]...)
			}
		}
	}
	a.out.Log(context.Background(), slogLevel(level), msg, args...)
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
	return newHCAdapter(a.base, a.name, append(a.implied[:len(a.implied):len(a.implied)], args...))
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
	return newHCAdapter(a.base, name, a.implied)
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
