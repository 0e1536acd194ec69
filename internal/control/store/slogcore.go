// SPDX-License-Identifier: Apache-2.0

package store

import (
	"context"
	"log/slog"
	"sort"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore is a zap core that hands etcd's log entries to a slog.Logger,
// so that the embedded etcd and the etcd client log through the agent's
// logger (its format, its destination) instead of a JSON stream of their
// own. Entries below the level are dropped; once closing is closed, the
// others go at debug level (a member that stops logs its listeners'
// errors, which are expected then).
type slogCore struct {
	zapcore.LevelEnabler
	log     *slog.Logger
	closing <-chan struct{}
	fields  []zapcore.Field
}

// slogZap returns a zap logger writing to l at level (zap's level names:
// debug, info, warn, error; an unknown name means error). closing may be
// nil.
func slogZap(l *slog.Logger, level string, closing <-chan struct{}) *zap.Logger {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		lvl = zapcore.ErrorLevel
	}
	return zap.New(&slogCore{LevelEnabler: lvl, log: l, closing: closing})
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{LevelEnabler: c.LevelEnabler, log: c.log, closing: c.closing, fields: append(c.fields[:len(c.fields):len(c.fields)], fields...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys)+1)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	lvl := slog.LevelError
	switch {
	case e.Level <= zapcore.DebugLevel:
		lvl = slog.LevelDebug
	case e.Level == zapcore.InfoLevel:
		lvl = slog.LevelInfo
	case e.Level == zapcore.WarnLevel:
		lvl = slog.LevelWarn
	}
	select {
	case <-c.closing:
		lvl = slog.LevelDebug
	default:
	}
	c.log.LogAttrs(context.Background(), lvl, e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
