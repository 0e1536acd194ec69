// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/testenv"
)

// serveWith runs a real vrdmad with the control-plane flags args until it
// logs that it serves, then stops it, and returns its log.
func serveWith(t *testing.T, args ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vrdmasec")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cmd, lines := startAgent(t, dir, args...)
	var log strings.Builder
	deadline := time.After(30 * time.Second)
	for !strings.Contains(log.String(), `msg="vrdmad serving"`) {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("vrdmad %s exited before it served: %v\n%s", strings.Join(args, " "), cmd.Wait(), log.String())
			}
			log.WriteString(l + "\n")
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("vrdmad %s did not serve within 30 s\n%s", strings.Join(args, " "), log.String())
		}
	}
	cmd.Process.Signal(os.Interrupt)
	for range lines {
	}
	cmd.Wait()
	return log.String()
}

// TestSecurityPlaintextEtcdRefused: vrdmad refuses an etcd reached over
// plaintext TCP (http://, or host:port without TLS flags), naming the rule
// and the fix, unless --insecure-etcd accepts it (with a warning); a Unix
// socket needs no TLS.
func TestSecurityPlaintextEtcdRefused(t *testing.T) {
	tcp := etcdtest.StartCluster(t, 1).Endpoints()[0] // http://127.0.0.1:port
	for _, ep := range []string{tcp, strings.TrimPrefix(tcp, "http://"), "unix:///nonexistent," + tcp} {
		// The real binary, bounded: an agent that does not refuse serves.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		dir := t.TempDir()
		var errb bytes.Buffer
		cmd := exec.CommandContext(ctx, testenv.AgentBinary(t), "--socket", filepath.Join(dir, "s"), "--state-dir", filepath.Join(dir, "state"), "--etcd-endpoints", ep)
		cmd.Stderr = &errb
		cmd.Run()
		cancel()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(errb.String(), "rule etcd-tls") || !strings.Contains(errb.String(), "is plaintext TCP") ||
			!strings.Contains(errb.String(), "--insecure-etcd") || !strings.Contains(errb.String(), "--etcd-cert") {
			t.Errorf("--etcd-endpoints %s: exit %d, stderr %q; want 2 and rule etcd-tls with its fix", ep, code, errb.String())
		}
	}
	if log := serveWith(t, "--etcd-endpoints", tcp, "--insecure-etcd"); !strings.Contains(log, "level=WARN") || !strings.Contains(log, "rule etcd-tls") {
		t.Errorf("--insecure-etcd: no warning logged:\n%s", log)
	}
	serveWith(t, "--etcd-endpoints", etcdtest.Start(t).ClientURL())
}
