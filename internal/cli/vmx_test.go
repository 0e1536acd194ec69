// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/rules"
)

// The lint fixtures of package rules (see its testdata/README.md).
const vmxFixtures = "../rules/testdata"

func vmxFixture(name string) string { return filepath.Join(vmxFixtures, name) }

// vmxJSON decodes the -o json report of vmx check and checks its shape:
// a list of {"file", "findings", "error"?} whose findings have exactly the
// fields rule, severity, key, line and message.
func vmxJSON(t *testing.T, out string) []vmxFileReport {
	t.Helper()
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("output is not a JSON list: %v\n%s", err, out)
	}
	for _, r := range raw {
		for k := range r {
			if k != "file" && k != "findings" && k != "error" {
				t.Errorf("unexpected field %q in %s", k, out)
			}
		}
		if _, ok := r["file"]; !ok {
			t.Errorf("no file field in %s", out)
		}
		var fs []map[string]any
		if string(r["findings"]) == "null" || json.Unmarshal(r["findings"], &fs) != nil || fs == nil {
			t.Fatalf("findings is not a list: %s", r["findings"])
		}
		for _, f := range fs {
			var keys []string
			for k := range f {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, []string{"key", "line", "message", "rule", "severity"}) {
				t.Errorf("finding fields %q; want key, line, message, rule, severity", keys)
			}
			if s := f["severity"]; s != "error" && s != "warning" {
				t.Errorf("severity %v", s)
			}
			if _, ok := f["line"].(float64); !ok {
				t.Errorf("line %v is not a number", f["line"])
			}
		}
	}
	var reps []vmxFileReport
	if err := unmarshalPrinted([]byte(out), &reps); err != nil {
		t.Fatal(err)
	}
	return reps
}

func reportRules(r vmxFileReport) []string {
	var ids []string
	for _, f := range r.Findings {
		ids = append(ids, f.Rule)
	}
	slices.Sort(ids)
	return ids
}

func TestVmxCheckExitCodes(t *testing.T) {
	isolate(t)
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // substrings of stdout
		stderr []string // substrings of stderr
	}{
		{name: "clean vSphere 8 file", args: []string{vmxFixture("vsphere8-pvrdma.vmx")}, code: 0,
			stdout: []string{"vsphere8-pvrdma.vmx: ok against ESXi 8.0"}},
		{name: "several clean files", args: []string{vmxFixture("minimal-vrdma.vmx"), vmxFixture("vsphere8-pvrdma.vmx")},
			code: 0, stdout: []string{"minimal-vrdma.vmx: ok against ESXi 8.0", "vsphere8-pvrdma.vmx: ok"}},
		{name: "ten adapters on 7.0U2", args: []string{vmxFixture("vsphere702-ten-adapters.vmx"), "--esxi", "7.0U2"},
			code: 0, stdout: []string{"vsphere702-ten-adapters.vmx: ok against ESXi 7.0 U2"}},
		{name: "ten adapters on 7.0U1", args: []string{vmxFixture("vsphere702-ten-adapters.vmx"), "--esxi", "7.0U1"},
			code: 1, stdout: []string{"[adapter-limit] the VM has 10 PVRDMA adapters", "[hw-version-supported]"}},
		{name: "warnings only", args: []string{vmxFixture("async-latency-sensitivity.vmx")}, code: 0,
			stdout: []string{"async-latency-sensitivity.vmx:20: warning [async-latency-sensitivity]", "0 errors, 1 warning"}},
		{name: "an error", args: []string{vmxFixture("memory-reservation.vmx")}, code: 1,
			stdout: []string{"memory-reservation.vmx:8: error [memory-reservation] sched.mem.min is 8191 MB", "2 errors, 0 warnings"}},
		{name: "an error among clean files", args: []string{vmxFixture("vsphere8-pvrdma.vmx"), vmxFixture("hw-version.vmx"), vmxFixture("minimal-vrdma.vmx")},
			code: 1, stdout: []string{"hw-version.vmx:5: error [hw-version]", "minimal-vrdma.vmx: ok"}},
		{name: "no finding on a line", args: []string{vmxFixture("hw-version-missing.vmx")}, code: 1,
			stdout: []string{"hw-version-missing.vmx: error [hw-version] virtualHW.version is not set"}},
		{name: "esxi makes an error", args: []string{vmxFixture("adapter-limit-701.vmx"), "--esxi", "8.0"}, code: 0},
		{name: "esxi 7.0 Update 1", args: []string{"--esxi", "7.0 Update 1", vmxFixture("adapter-limit-701.vmx")}, code: 1,
			stdout: []string{"[adapter-limit]", "against ESXi 7.0 U1"}},
		{name: "unterminated quote", args: []string{vmxFixture("broken/unterminated.vmx")}, code: 2,
			stderr: []string{"unterminated.vmx: cannot parse: line 1: the value of \"memSize\" has no closing double quote"}},
		{name: "line without =", args: []string{vmxFixture("broken/no-equals.vmx")}, code: 2, stderr: []string{`line 2: "guestOS" has no '='`}},
		{name: "bad escape", args: []string{vmxFixture("broken/bad-escape.vmx")}, code: 2, stderr: []string{"line 1: bad escape"}},
		{name: "binary", args: []string{vmxFixture("broken/binary.vmx")}, code: 2, stderr: []string{"line 1: control byte 0x7F"}},
		{name: "NUL bytes", args: []string{vmxFixture("broken/nul.vmx")}, code: 2, stderr: []string{"line 2: NUL byte at column 1: this looks like binary data"}},
		{name: "missing file", args: []string{"/nonexistent/vm.vmx"}, code: 2, stderr: []string{"/nonexistent/vm.vmx: no such file"}},
		{name: "a directory", args: []string{vmxFixtures}, code: 2, stderr: []string{"is a directory"}},
		{name: "unreadable beats errors", args: []string{vmxFixture("hw-version.vmx"), vmxFixture("broken/binary.vmx")}, code: 2,
			stdout: []string{"hw-version.vmx:5: error"}, stderr: []string{"binary.vmx: cannot parse"}},
		{name: "no file", args: nil, code: 2, stderr: []string{"name at least one .vmx file"}},
		{name: "bad esxi", args: []string{"--esxi", "7", vmxFixture("minimal-vrdma.vmx")}, code: 2,
			stderr: []string{`--esxi: invalid ESXi version "7": the minor version is missing`}},
		{name: "esxi 6.0", args: []string{"--esxi", "6.0", vmxFixture("vsphere65-pvrdma.vmx")}, code: 1,
			stdout: []string{"[esxi-version]", "[hw-version-supported]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errs, code := run(t, "", append([]string{"vmx", "check"}, tt.args...)...)
			if code != tt.code {
				t.Fatalf("exit %d; want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, out, errs)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(errs, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errs)
				}
			}
			if tt.code != 2 && errs != "" {
				t.Errorf("stderr: %s", errs)
			}
			if strings.Contains(errs, "--help") && len(tt.args) > 0 && !strings.Contains(errs, "--esxi") {
				t.Errorf("a file error is not a usage error: %s", errs)
			}
		})
	}
}

func TestVmxCheckJSON(t *testing.T) {
	isolate(t)
	// Whatever the exit status, the report is on stdout.
	out, errs, code := run(t, "", "vmx", "check", "-o", "json", vmxFixture("vsphere8-pvrdma.vmx"), vmxFixture("duplicate-key.vmx"))
	if code != 0 {
		t.Fatalf("exit %d; want 0 (warnings only)\n%s\n%s", code, out, errs)
	}
	reps := vmxJSON(t, out)
	if len(reps) != 2 || reps[0].File != vmxFixture("vsphere8-pvrdma.vmx") || len(reps[0].Findings) != 0 ||
		!slices.Equal(reportRules(reps[1]), []string{"duplicate-key", "duplicate-key"}) {
		t.Fatalf("report %+v", reps)
	}
	if !strings.Contains(out, `"findings": []`) {
		t.Errorf("a clean file's findings are not an empty list:\n%s", out)
	}
	d := reps[1].Findings[0]
	if d.Key != "memSize" || d.Line != 19 || d.Severity != "warning" || !strings.Contains(d.Message, "set on line 7 and again on line 19") {
		t.Errorf("duplicate finding %+v", d)
	}

	out, _, code = run(t, "", "vmx", "check", "-o", "json", "--esxi", "7.0", vmxFixture("native-endpoint-version.vmx"))
	if code != 1 {
		t.Fatalf("exit %d; want 1\n%s", code, out)
	}
	reps = vmxJSON(t, out)
	if len(reps) != 1 || !slices.Equal(reportRules(reps[0]), []string{"native-endpoint-hw", "native-endpoint-version"}) {
		t.Fatalf("report %+v", reps)
	}
	if f := reps[0].Findings[0]; f.Key != "vrdma1.nativeEndpointSupport" || f.Line != 20 || f.Severity != "error" {
		t.Errorf("finding %+v", f)
	}

	out, errs, code = run(t, "", "vmx", "check", "-o", "json", vmxFixture("broken/unterminated.vmx"), vmxFixture("guest-os.vmx"))
	if code != 2 {
		t.Fatalf("exit %d; want 2\n%s", code, out)
	}
	reps = vmxJSON(t, out)
	if len(reps) != 2 || !strings.Contains(reps[0].Error, "line 1:") || len(reps[0].Findings) != 0 ||
		reps[1].Error != "" || !slices.Equal(reportRules(reps[1]), []string{"guest-os"}) {
		t.Fatalf("report %+v", reps)
	}
	if !strings.Contains(errs, "unterminated.vmx") {
		t.Errorf("stderr: %q", errs)
	}
}

func TestVmxCheckInputs(t *testing.T) {
	isolate(t)
	good, err := os.ReadFile(vmxFixture("minimal-vrdma.vmx"))
	if err != nil {
		t.Fatal(err)
	}
	out, errs, code := run(t, string(good), "vmx", "check", "-")
	if code != 0 || !strings.Contains(out, "-: ok") {
		t.Fatalf("stdin: exit %d\n%s\n%s", code, out, errs)
	}
	_, errs, code = run(t, string(good), "vmx", "check", "-", "-")
	if code != 2 || !strings.Contains(errs, "standard input is named twice") {
		t.Fatalf("stdin twice: exit %d, %q", code, errs)
	}

	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.vmx")
	if err := os.WriteFile(huge, []byte(strings.Repeat("# padding\n", 200000)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code = run(t, "", "vmx", "check", huge)
	if code != 2 || !strings.Contains(errs, "larger than the 1048576-byte limit") {
		t.Fatalf("huge file: exit %d, %q", code, errs)
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		_, errs, code = run(t, "", "vmx", "check", "/dev/zero")
		if code != 2 || !strings.Contains(errs, "/dev/zero: larger than") {
			t.Fatalf("/dev/zero: exit %d, %q", code, errs)
		}
	}
	// Unknown keys are kept and ignored; keys are compared without case.
	odd := filepath.Join(dir, "odd.vmx")
	if err := os.WriteFile(odd, []byte(strings.ToUpper(string(good))+"some.future.key = \"|22quoted|22\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The whole file in upper case: keys, "VRDMA", "TRUE" and guest IDs
	// are read without regard to case.
	if out, errs, code := run(t, "", "vmx", "check", odd); code != 0 {
		t.Fatalf("upper-case file: exit %d\n%s\n%s", code, out, errs)
	}
}

func TestVmxRules(t *testing.T) {
	isolate(t)
	var rs []rules.Rule
	runJSON(t, &rs, "vmx", "rules", "-o", "json")
	if len(rs) != len(rules.Rules()) {
		t.Fatalf("%d rules; want %d", len(rs), len(rules.Rules()))
	}
	out := runOK(t, "vmx", "rules")
	for _, r := range rules.Rules() {
		if !strings.Contains(out, r.ID) {
			t.Errorf("vmx rules lacks %s:\n%s", r.ID, out)
		}
	}
	_, errs, code := run(t, "", "vmx")
	if code != exitUsage || !strings.Contains(errs, "check or rules") {
		t.Errorf("vmx: exit %d, %q", code, errs)
	}
	if help := runOK(t, "--help"); !strings.Contains(help, "vmx") {
		t.Errorf("help lacks vmx:\n%s", help)
	}
}

// TestVmxCheckHost runs the host rules against hosts of a control plane.
func TestVmxCheckHost(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	st := etcdtest.Open(t, ep)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, h := range []records.Host{
		{ID: "h1", Name: "esx1", Switch: "dvs1", PVRDMAAddress: netip.MustParseAddrPort("10.0.0.1:4791"), FirewallPVRDMA: true,
			AgentVersion: "test", State: records.HostUp},
		{ID: "h2", Name: "esx2", AgentVersion: "test", State: records.HostUp},
	} {
		if _, err := st.Create(ctx, records.HostKey(h.ID), h); err != nil {
			t.Fatal(err)
		}
	}
	// esx1 is up (it holds a lease); esx2 is down.
	if _, err := st.Create(ctx, records.AliveKey("h1"), records.Alive{HostID: "h1", Lease: 1, TTL: 10, AgentVersion: "test"}); err != nil {
		t.Fatal(err)
	}
	file := vmxFixture("minimal-vrdma.vmx") // its adapter is on port group dvportgroup-10 of switch dvs1

	// The port group does not exist yet: power-on's placement check says so.
	out, errs, code := run(t, "", "--etcd-endpoints", ep, "vmx", "check", "--host", "esx1", file)
	if code != 1 || !strings.Contains(out, "[portgroup-exists]") || !strings.Contains(out, "minimal-vrdma.vmx:10:") {
		t.Fatalf("host esx1 without the port group: exit %d\n%s\n%s", code, out, errs)
	}
	sw := records.Switch{Name: "dvs1", UUID: "50 1a 2b 3c 4d 5e 6f 70-81 92 a3 b4 c5 d6 e7 f8", MTU: 9000, UplinkPolicy: records.UplinkSingle}
	pg := records.PortGroup{Name: "dvportgroup-10", Key: "dvportgroup-10", Switch: "dvs1", VLAN: 10, RoCEVersion: records.RoCEv2}
	if _, err := st.Create(ctx, records.SwitchKey(sw.Name), sw); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		t.Fatal(err)
	}
	out, errs, code = run(t, "", "--etcd-endpoints", ep, "vmx", "check", "--host", "esx1", file)
	if code != 0 || !strings.Contains(out, "ok against ESXi 8.0 (vrdma's level; --esxi to change) and host esx1") {
		t.Fatalf("host esx1: exit %d\n%s\n%s", code, out, errs)
	}
	out, errs, code = run(t, "", "--etcd-endpoints", ep, "-o", "json", "vmx", "check", "--host", "h2", file)
	if code != 1 {
		t.Fatalf("host h2: exit %d\n%s\n%s", code, out, errs)
	}
	reps := vmxJSON(t, out)
	if len(reps) != 1 || !slices.Equal(reportRules(reps[0]), []string{"host-on-switch", "host-rdma-configured", "host-rdma-configured", "host-up"}) {
		t.Fatalf("host h2: %+v", reps)
	}
	for _, f := range reps[0].Findings {
		if !strings.Contains(f.Message, "esx2") {
			t.Errorf("message does not name the host: %q", f.Message)
		}
	}
	_, errs, code = run(t, "", "--etcd-endpoints", ep, "vmx", "check", "--host", "nosuch", file)
	if code != 2 || !strings.Contains(errs, "host nosuch: not found in the control plane") {
		t.Fatalf("unknown host: exit %d, %q", code, errs)
	}
}
