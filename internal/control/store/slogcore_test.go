// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestSlogZap checks the bridge etcd logs through: entries at or above
// the level reach the slog handler with their level, message, logger name
// and fields (With's among them); entries below it do not; once closing,
// entries go at debug level.
func TestSlogZap(t *testing.T) {
	var buf bytes.Buffer
	closing := make(chan struct{})
	l := slogZap(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), "warn", closing)
	l = l.Named("raft").With(zap.String("member", "m1"))
	l.Info("below the level")
	l.Warn("slow fdatasync", zap.Int("took_ms", 1200), zap.Error(errors.New("disk busy")))
	l.Error("lost leader")
	close(closing)
	l.Error("accept: use of closed network connection")
	out := buf.String()
	if strings.Contains(out, "below the level") {
		t.Errorf("an info entry passed a warn level:\n%s", out)
	}
	for _, want := range []string{
		`level=WARN msg="slow fdatasync" logger=raft error="disk busy" member=m1 took_ms=1200`,
		`level=ERROR msg="lost leader" logger=raft member=m1`,
		`level=DEBUG msg="accept: use of closed network connection" logger=raft member=m1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("want a line with %q in:\n%s", want, out)
		}
	}
	if strings.Count(out, "\n") != 3 {
		t.Errorf("want 3 lines:\n%s", out)
	}
}
