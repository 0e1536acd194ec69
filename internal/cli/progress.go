// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressAfter is how long a run goes before its progress bar shows (a
// variable for the tests).
var progressAfter = 2 * time.Second

// startProgress draws a progress bar of one run on w (a terminal) from
// progressAfter on, every 200 ms: the fraction of total iterations done
// (done, which the run keeps) or, for a run of a duration, of the time.
// The returned stop ends it and clears the line. Its goroutine is the
// only writer to w until stop returns.
func startProgress(w io.Writer, label string, done *atomic.Int64, total int, dur time.Duration) (stop func()) {
	quit := make(chan struct{})
	ended := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(ended)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		drawn := false
		for {
			select {
			case <-quit:
				if drawn {
					fmt.Fprintf(w, "\r%s\r", strings.Repeat(" ", 72))
				}
				return
			case <-t.C:
			}
			el := time.Since(start)
			if el < progressAfter {
				continue
			}
			frac := 0.0
			if dur > 0 {
				frac = float64(el) / float64(dur)
			} else if total > 0 {
				frac = float64(done.Load()) / float64(total)
			}
			frac = min(max(frac, 0), 1)
			const width = 40
			n := int(frac * width)
			fmt.Fprintf(w, "\r%-14.14s [%s%s] %3.0f%% %5.1fs", label, strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*frac, el.Seconds())
			drawn = true
		}
	}()
	return func() {
		close(quit)
		<-ended
	}
}
