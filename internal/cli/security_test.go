// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
)

// TestSecurityPlaintextEtcdRefused: vrdmactl refuses an etcd reached over
// plaintext TCP (http://, or host:port without TLS flags), naming the rule
// and the fix, unless --insecure-etcd accepts it (with a warning); a Unix
// socket needs no TLS.
func TestSecurityPlaintextEtcdRefused(t *testing.T) {
	tcp := etcdtest.StartCluster(t, 1).Endpoints()[0] // http://127.0.0.1:port
	for _, ep := range []string{tcp, strings.TrimPrefix(tcp, "http://")} {
		out, errs, code := run(t, "", "--etcd-endpoints", ep, "switch", "list")
		if code != exitUsage || !strings.Contains(errs, "rule etcd-tls: the control plane at "+ep+" is plaintext TCP") ||
			!strings.Contains(errs, "--insecure-etcd") || !strings.Contains(errs, "--etcd-cert") {
			t.Errorf("--etcd-endpoints %s: exit %d, stdout %q, stderr %q; want %d and rule etcd-tls with its fix", ep, code, out, errs, exitUsage)
		}
	}
	if _, errs, code := run(t, "", "--etcd-endpoints", tcp, "--insecure-etcd", "switch", "list"); code != 0 || !strings.Contains(errs, "warning: rule etcd-tls") {
		t.Errorf("--insecure-etcd: exit %d, stderr %q; want 0 and a warning", code, errs)
	}
	runOK(t, "--etcd-endpoints", etcdtest.Start(t).ClientURL(), "switch", "list")
}
