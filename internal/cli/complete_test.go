// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestCompletionNames asks for completions as a shell does (cobra's
// __complete) with an agent and a control plane that know a switch, two
// port groups, a host and VMs: positional arguments and flags offer those
// names, filtered by what is typed.
func TestCompletionNames(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	a := testenv.StartControl(t, "esx1", hostCfg(ep, "127.0.0.1", false))
	fabric(t, ep)
	a.Open(t, "web1", testenv.VMOptions{})
	a.Open(t, "web2", testenv.VMOptions{})
	a.Open(t, "db", testenv.VMOptions{})
	on := []string{"__complete", "--socket", a.Socket, "--etcd-endpoints", ep}
	complete := func(args ...string) []string {
		t.Helper()
		out := runOK(t, append(on, args...)...)
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.HasPrefix(l, ":") { // the last line is the directive
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
		}
		return got
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"switch", "show", ""}, "dvs1"},
		{[]string{"switch", "delete", "dv"}, "dvs1"},
		{[]string{"switch", "show", "dvs1", ""}, ""}, // one argument only
		{[]string{"portgroup", "show", ""}, "dvportgroup-10 dvportgroup-20"},
		{[]string{"portgroup", "show", "dvportgroup-2"}, "dvportgroup-20"},
		{[]string{"host", "show", ""}, "esx1"},
		{[]string{"vm", "power-off", "web"}, "web1 web2"},
		{[]string{"vm", "show", ""}, "db web1 web2"},
		{[]string{"devinfo", "--vm", "d"}, "db"},
		{[]string{"vm", "power-on", "web1", "--host", ""}, "esx1"},
		{[]string{"vm", "edit", "web1", "--portgroup", "dvportgroup-1"}, "dvportgroup-10"},
		{[]string{"stat", "web1"}, "web1 web1/vrdma0"},
		{[]string{"res", "w"}, "web1 web2"},
		{[]string{"path", "explain", "web1/vrdma0", "db/"}, "db/vrdma0"},
		{[]string{"perf", "write_bw", "--vm", "db", "-d", ""}, "vrdma0"},
	} {
		if got := strings.Join(complete(c.args...), " "); got != c.want {
			t.Errorf("vrdmactl %s<TAB>: %q, want %q", strings.Join(c.args, " "), got, c.want)
		}
	}
}
