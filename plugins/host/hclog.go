package host

import (
	"fmt"
	"io"
	stdlog "log"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/rs/zerolog"
)

// zlog is an hclog.Logger that writes to zerolog: go-plugin's own messages
// and every log line of a plugin (the SDK logs JSON through hclog on the
// plugin's stderr, which go-plugin parses and re-logs here) end up in the
// engine's log, with the plugin's file name as the "plugin" field.
type zlog struct {
	z     zerolog.Logger
	name  string
	args  []any
	level hclog.Level
}

func newZlog(z zerolog.Logger, plugin string) hclog.Logger {
	return &zlog{z: z.With().Str("plugin", plugin).Logger(), level: hclog.Trace}
}

func toZerolog(l hclog.Level) zerolog.Level {
	switch l {
	case hclog.Trace:
		return zerolog.TraceLevel
	case hclog.Debug:
		return zerolog.DebugLevel
	case hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return zerolog.InfoLevel
	case hclog.Warn:
		return zerolog.WarnLevel
	case hclog.Error:
		return zerolog.ErrorLevel
	}
	return zerolog.Disabled
}

func (l *zlog) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off || (level != hclog.NoLevel && level < l.level) {
		return
	}
	ev := l.z.WithLevel(toZerolog(level))
	if ev == nil {
		return
	}
	if l.name != "" {
		ev = ev.Str("logger", l.name)
	}
	all := append(append([]any(nil), l.args...), args...)
	for i := 0; i < len(all); i += 2 {
		key := fmt.Sprint(all[i])
		switch key {
		case "plugin":
			key = "plugin_path" // go-plugin's own field; "plugin" is the plugin's name here
		case zerolog.LevelFieldName, zerolog.MessageFieldName, zerolog.TimestampFieldName, zerolog.ErrorFieldName, "logger":
			key = "plugin_" + key // a plugin cannot shadow the line's own keys
		}
		if i+1 >= len(all) {
			ev = ev.Interface("EXTRA_VALUE_AT_END", all[i])
			break
		}
		switch v := all[i+1].(type) {
		case error:
			ev = ev.AnErr(key, v)
		case string:
			ev = ev.Str(key, v)
		default:
			ev = ev.Interface(key, v)
		}
	}
	ev.Msg(msg)
}

func (l *zlog) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }
func (l *zlog) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }
func (l *zlog) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l *zlog) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l *zlog) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

func (l *zlog) enabled(level hclog.Level) bool {
	return level >= l.level && toZerolog(level) >= l.z.GetLevel()
}

func (l *zlog) IsTrace() bool { return l.enabled(hclog.Trace) }
func (l *zlog) IsDebug() bool { return l.enabled(hclog.Debug) }
func (l *zlog) IsInfo() bool  { return l.enabled(hclog.Info) }
func (l *zlog) IsWarn() bool  { return l.enabled(hclog.Warn) }
func (l *zlog) IsError() bool { return l.enabled(hclog.Error) }

func (l *zlog) ImpliedArgs() []any { return l.args }

func (l *zlog) With(args ...any) hclog.Logger {
	c := *l
	c.args = append(append([]any(nil), l.args...), args...)
	return &c
}

func (l *zlog) Name() string { return l.name }

func (l *zlog) Named(name string) hclog.Logger {
	c := *l
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (l *zlog) ResetNamed(name string) hclog.Logger {
	c := *l
	c.name = name
	return &c
}

func (l *zlog) SetLevel(level hclog.Level) { l.level = level }

func (l *zlog) GetLevel() hclog.Level {
	// go-plugin skips parsing a plugin's stderr when this says Off.
	if l.z.GetLevel() == zerolog.Disabled {
		return hclog.Off
	}
	return l.level
}

func (l *zlog) StandardLogger(opts *hclog.StandardLoggerOptions) *stdlog.Logger {
	return stdlog.New(l.StandardWriter(opts), "", 0)
}

func (l *zlog) StandardWriter(*hclog.StandardLoggerOptions) io.Writer { return lineWriter{l} }

type lineWriter struct{ l *zlog }

func (w lineWriter) Write(p []byte) (int, error) {
	w.l.Info(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
