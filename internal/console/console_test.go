// SPDX-License-Identifier: Apache-2.0

package console

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/netcheck"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// Tests of the console's API against a running agent with a control
// plane (an embedded etcd): the inventory it reads, the VM procedures it
// runs through the agent, and who may use it.

// fabric is a control plane with switch dvs1, its port groups
// dvportgroup-10 and -20, and host esx1 (an agent with a software RoCEv2
// uplink) on it, with the console in front of them.
type fabric struct {
	env   *testenv.Env
	ag    *vrdma.Agent
	ep    string // the etcd's client URL
	st    *store.Store
	cache *member.Cache
	cfg   Config
	srv   *httptest.Server
}

// testAddr is the loopback address of the test host's PVRDMA listener:
// this package's own, so that it does not clash with other packages'
// tests running at the same time.
const testAddr = "127.0.38.1"

func startFabric(t *testing.T, token string) *fabric {
	t.Helper()
	ep := etcdtest.Start(t).ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.Open(ctx, store.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Create(ctx, records.SwitchKey("dvs1"), records.Switch{Name: "dvs1", UUID: "50 1d 2a 3b 4c 5d 6e 7f-80 91 a2 b3 c4 d5 e6 f7", MTU: 9000, UplinkPolicy: records.UplinkSingle}); err != nil {
		t.Fatal(err)
	}
	for _, pg := range []records.PortGroup{
		{Name: "rdma-10", Key: "dvportgroup-10", Switch: "dvs1", VLAN: 10, PFCPriority: 3, DSCP: 26, RoCEVersion: "v2"},
		{Name: "rdma-20", Key: "dvportgroup-20", Switch: "dvs1", VLAN: 20, PFCPriority: 3, DSCP: 26, RoCEVersion: "v2"},
	} {
		if _, err := st.Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
			t.Fatal(err)
		}
	}
	uplink, err := agent.ParseUplink("rocev2-soft/" + testAddr)
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.StartControl(t, "esx1", agent.ControlConfig{Endpoints: []string{ep}, Switch: "dvs1", FirewallPVRDMA: true,
		PVRDMAAddress: netip.MustParseAddrPort(testAddr + ":4791"), Uplinks: []records.Uplink{uplink}})
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Close() })
	c := member.NewCache(st, member.CacheConfig{LookupTimeout: 5 * time.Second})
	t.Cleanup(c.Close)
	select {
	case <-c.Synced():
	case <-ctx.Done():
		t.Fatalf("the control plane's cache: %v", c.Err())
	}
	f := &fabric{env: env, ag: ag, ep: ep, st: st, cache: c, cfg: Config{Socket: env.Socket, Cache: c, Store: st, Token: token}}
	f.srv = httptest.NewServer(New(f.cfg))
	t.Cleanup(f.srv.Close)
	return f
}

// reconfigure serves the console again with its configuration changed
// by change.
func (f *fabric) reconfigure(t *testing.T, change func(*Config)) {
	t.Helper()
	f.srv.Close()
	change(&f.cfg)
	f.srv = httptest.NewServer(New(f.cfg))
	t.Cleanup(f.srv.Close)
}

// addHost starts host name's agent on switch dvs1, with its PVRDMA
// listener on addr:4791 and no RDMA uplink, and returns it.
func (f *fabric) addHost(t *testing.T, name, addr string) (*testenv.Env, *vrdma.Agent) {
	t.Helper()
	env := testenv.StartControl(t, name, agent.ControlConfig{Endpoints: []string{f.ep}, Switch: "dvs1", FirewallPVRDMA: true,
		PVRDMAAddress: netip.MustParseAddrPort(addr + ":4791")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Close() })
	return env, ag
}

// createVM creates managed VM name, powered off, with no adapter.
func (f *fabric) createVM(t *testing.T, name string) {
	t.Helper()
	f.createVMOn(t, f.ag, name)
}

// createVMOn creates managed VM name on agent ag's host, powered off,
// with 4 MB of memory and no adapter.
func (f *fabric) createVMOn(t *testing.T, ag *vrdma.Agent, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	vmx, err := vmconfig.NewVMX(name, 4, 20, "ubuntu-64")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ag.CreateVM(ctx, vrdma.VMSpec{Name: name, VMX: vmx}); err != nil {
		t.Fatal(err)
	}
	f.waitVM(t, name)
}

// waitVM waits until the cache has seen VM name's latest change.
func (f *fabric) waitVM(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.cache.VM(ctx, name); err != nil {
		t.Fatalf("VM %s in the control plane: %v", name, err)
	}
}

// call sends a request to the console and decodes its JSON answer into
// out (if not nil); it returns the status.
func call(t *testing.T, srv *httptest.Server, method, path string, body any, out any, hdr ...string) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(writeHeader, "1")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

func rulesOf(fs []vrdma.Finding) string {
	var s []string
	for _, f := range fs {
		s = append(s, f.Severity+":"+f.Rule)
	}
	return strings.Join(s, " ")
}

// TestInventoryTree checks the tree: switch → port groups with their
// settings → the switch's hosts, alive → the VMs with an adapter on the
// port group; a VM with none is listed apart.
func TestInventoryTree(t *testing.T) {
	start := time.Now()
	f := startFabric(t, "")
	f.createVM(t, "web")
	var inv Inventory
	if code := call(t, f.srv, "GET", "/api/inventory", nil, &inv); code != 200 {
		t.Fatalf("GET /api/inventory: %d", code)
	}
	if !inv.Control || len(inv.Switches) != 1 || inv.Switches[0].Name != "dvs1" || len(inv.Switches[0].PortGroups) != 2 {
		t.Fatalf("inventory: %+v", inv)
	}
	pg := inv.Switches[0].PortGroups[0]
	if pg.Key != "dvportgroup-10" || pg.VLAN != 10 || pg.PFCPriority != 3 || pg.DSCP != 26 || pg.RoCEVersion != "v2" || len(pg.Hosts) != 1 {
		t.Fatalf("port group: %+v", pg)
	}
	// The lease was claimed while the fabric started (rounded to 10 ms:
	// 0 when the page came within 5 ms of it).
	if h := pg.Hosts[0]; h.Name != "esx1" || h.State != "up" || h.LeaseAgeS < 0 || h.LeaseAgeS > time.Since(start).Seconds()+0.01 || len(h.VMs) != 0 {
		t.Errorf("host under the port group: %+v, want esx1 up with a lease claimed since the test began, no VMs", h)
	}
	if len(inv.Unplaced) != 1 || len(inv.Unplaced[0].VMs) != 1 || inv.Unplaced[0].VMs[0].Name != "web" || inv.Unplaced[0].VMs[0].Power != "poweredOff" {
		t.Errorf("VMs on no port group: %+v", inv.Unplaced)
	}

	var r vrdma.EditResult
	if code := call(t, f.srv, "POST", "/api/vms/web/edit", vrdma.VMEdit{AddAdapters: []vrdma.NewAdapter{{PortGroup: "dvportgroup-20"}}}, &r); code != 200 || r.Refused {
		t.Fatalf("add an adapter: %d %+v", code, r)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		call(t, f.srv, "GET", "/api/inventory", nil, &inv)
		vms := inv.Switches[0].PortGroups[1].Hosts[0].VMs
		if len(vms) == 1 && vms[0].Name == "web" && len(vms[0].Adapters) == 1 && vms[0].Adapters[0] == (AdapterNode{Name: "vrdma0", PortGroup: "dvportgroup-20", StartConnected: true}) {
			if len(inv.Unplaced) != 0 || len(inv.Switches[0].PortGroups[0].Hosts[0].VMs) != 0 {
				t.Errorf("web is also elsewhere in the tree: %+v", inv)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("web is not under dvportgroup-20 10 s after its adapter was added: %+v", inv.Switches[0].PortGroups[1])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestVMProcedure walks the add-adapter procedure through the API: the
// checks before saving (a dry run stores nothing), the save, a refused
// power-on with every failed rule, the reservation, the power-on, an
// edit refused while powered on, and the power-off.
func TestVMProcedure(t *testing.T) {
	f := startFabric(t, "")
	f.createVM(t, "db")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var p VMPage
	var e map[string]string
	if code := call(t, f.srv, "GET", "/api/vms/db", nil, &p); code != 200 || p.VM.Power != "poweredOff" || len(p.Adapters) != 0 || p.MemSizeMB != 4 || p.MemoryReserved ||
		len(p.PortGroups) != 2 || p.PortGroups[0].Key != "dvportgroup-10" {
		t.Fatalf("GET /api/vms/db: %d %+v", code, p)
	}
	add := vrdma.VMEdit{AddAdapters: []vrdma.NewAdapter{{PortGroup: "dvportgroup-10"}}, Set: []vrdma.KeyValue{{Key: "vrdma.asyncMode", Value: "TRUE"}}, DryRun: true}
	var r vrdma.EditResult
	if code := call(t, f.srv, "POST", "/api/vms/db/edit", add, &r); code != 200 || r.Refused || !strings.Contains(r.VM.VMX, `ethernet0.dvs.portgroupId = "dvportgroup-10"`) ||
		!strings.Contains(r.VM.VMX, `vrdma.asyncMode = "TRUE"`) ||
		!strings.Contains(rulesOf(r.Findings), "error:memory-reservation") {
		t.Fatalf("dry run: %d %+v", code, r)
	}
	if in, err := f.ag.VM(ctx, "db"); err != nil || strings.Contains(in.VMX, "ethernet0") {
		t.Fatalf("the dry run stored its change: %v\n%s", err, in.VMX)
	}
	add.DryRun = false
	if code := call(t, f.srv, "POST", "/api/vms/db/edit", add, &r); code != 200 || r.Refused || !strings.Contains(r.VM.VMX, "ethernet0.virtualDev") {
		t.Fatalf("save: %d %+v", code, r)
	}

	// A change that breaks a rule is refused before saving, with the rule.
	var bad vrdma.EditResult
	if code := call(t, f.srv, "POST", "/api/vms/db/edit", vrdma.VMEdit{Set: []vrdma.KeyValue{{Key: "virtualHW.version", Value: "10"}}, DryRun: true}, &bad); code != 200 || !bad.Refused ||
		!strings.Contains(rulesOf(bad.Findings), "error:hw-version") {
		t.Errorf("dry run breaking hw-version: %d %+v", code, bad)
	}
	var pw vrdma.PowerResult
	if code := call(t, f.srv, "POST", "/api/vms/db/power-on", map[string]string{}, &pw); code != 200 || !pw.Refused || pw.Changed ||
		!strings.Contains(rulesOf(pw.Findings), "error:memory-reservation") {
		t.Fatalf("power-on without the reservation: %d %+v, want refused by memory-reservation", code, pw)
	}
	if code := call(t, f.srv, "POST", "/api/vms/db/edit", vrdma.VMEdit{ReserveAllMemory: true}, &r); code != 200 || r.Refused {
		t.Fatalf("reserve all memory: %d %+v", code, r)
	}
	call(t, f.srv, "GET", "/api/vms/db", nil, &p)
	if !p.MemoryReserved || len(p.Adapters) != 1 || p.Adapters[0].PortGroup != "dvportgroup-10" {
		t.Errorf("after the edits: %+v", p)
	}
	if len(p.Hosts) != 1 || p.Hosts[0].Name != "esx1" || p.Hosts[0].State != "up" {
		t.Errorf("the hosts to power on on: %+v", p.Hosts)
	}
	if code := call(t, f.srv, "POST", "/api/vms/db/power-on", map[string]string{"host": "esx9"}, &e); code != 404 || !strings.Contains(e["error"], "esx9") {
		t.Errorf("power-on on host esx9: %d %v, want 404 naming it", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/vms/db/power-on", map[string]string{"host": p.Hosts[0].ID}, &pw); code != 200 || pw.Refused || !pw.Changed || pw.VM.Power != "poweredOn" || pw.VM.Host != "esx1" {
		t.Fatalf("power-on: %d %+v", code, pw)
	}
	if code := call(t, f.srv, "POST", "/api/vms/db/edit", vrdma.VMEdit{Set: []vrdma.KeyValue{{Key: "vrdma.asyncMode", Value: "FALSE"}}, DryRun: true}, &e); code != http.StatusConflict ||
		!strings.Contains(e["error"], "power") {
		t.Errorf("edit while powered on: %d %v, want 409 saying to power off", code, e)
	}

	// The live view: the attached VM with its adapter and QP.
	vm, err := vrdma.Open(ctx, "db", vrdma.WithSocket(f.env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	var l Live
	if code := call(t, f.srv, "GET", "/api/live", nil, &l); code != 200 || l.Host != "esx1" || len(l.VMs) != 1 || l.VMs[0].Name != "db" {
		t.Errorf("GET /api/live: %d %+v", code, l)
	}
	var hp HostPage
	if code := call(t, f.srv, "GET", "/api/hosts/"+f.env.Agent.HostID(), nil, &hp); code != 200 || !hp.Local || hp.PVRDMAAddress != testAddr+":4791" ||
		!hp.FirewallPVRDMA || hp.Switch != "dvs1" || hp.PVRDMA == nil {
		t.Errorf("GET /api/hosts/ID: %d %+v", code, hp)
	}
	var cr vrdma.ConnectResult
	if code := call(t, f.srv, "POST", "/api/vms/db/connect", map[string]any{"adapter": "vrdma0", "connected": false}, &cr); code != 200 || !cr.Changed || cr.Connected || cr.Workloads != 1 {
		t.Errorf("disconnect vrdma0: %d %+v", code, cr)
	}
	if code := call(t, f.srv, "POST", "/api/vms/db/connect", map[string]any{"adapter": "vrdma0", "connected": false}, &cr); code != 200 || cr.Changed {
		t.Errorf("disconnect vrdma0 again: %d %+v, want no change", code, cr)
	}
	if code := call(t, f.srv, "POST", "/api/vms/db/connect", map[string]any{"adapter": "vrdma0", "connected": true}, &cr); code != 200 || !cr.Changed || !cr.Connected {
		t.Errorf("connect vrdma0: %d %+v", code, cr)
	}
	if code := call(t, f.srv, "POST", "/api/vms/db/connect", map[string]any{"adapter": "eth0", "connected": true}, &e); code != 400 {
		t.Errorf("connect eth0: %d %v", code, e)
	}
	var pa PathAnswer
	if code := call(t, f.srv, "GET", "/api/path?a=db/vrdma0&b=db/vrdma0", nil, &pa); code != 200 || !pa.OK || pa.Path != "memcpy" || len(pa.Rejected) == 0 {
		t.Errorf("GET /api/path db/vrdma0 db/vrdma0: %d %+v", code, pa)
	}
	for _, q := range []string{"a=db/vrdma0&b=..%2Fhosts", "a=db/vrdma9&b=db/vrdma0", "a=x&b=y"} {
		pa = PathAnswer{}
		if code := call(t, f.srv, "GET", "/api/path?"+q, nil, &pa); code != 200 || pa.OK || pa.Error == "" {
			t.Errorf("GET /api/path?%s: %d %+v, want an answer that they cannot connect, and why", q, code, pa)
		}
	}
	if code := call(t, f.srv, "GET", "/api/path?a=db/vrdma0", nil, &e); code != 400 {
		t.Errorf("GET /api/path with one end: %d %v", code, e)
	}
	for _, id := range []string{"nosuchhost", "..%2Fswitches%2Fdvs1", "%00"} {
		if code := call(t, f.srv, "GET", "/api/hosts/"+id, nil, &e); code != 404 {
			t.Errorf("GET /api/hosts/%s: %d %v", id, code, e)
		}
	}

	if code := call(t, f.srv, "POST", "/api/vms/db/power-off", map[string]string{}, &pw); code != 200 || !pw.Changed || pw.VM.Power != "poweredOff" || !pw.Detached {
		t.Errorf("power-off: %d %+v", code, pw)
	}
	if code := call(t, f.srv, "GET", "/api/vms/nosuch", nil, &e); code != 404 || e["error"] == "" {
		t.Errorf("GET /api/vms/nosuch: %d %v", code, e)
	}
}

// TestGuards checks who may use the console: the token, the write
// header, foreign origins and hosts, bad bodies, and where it may listen.
func TestGuards(t *testing.T) {
	f := startFabric(t, "s3cret")
	var e map[string]string
	if code := call(t, f.srv, "GET", "/api/inventory", nil, &e); code != 401 || !strings.Contains(e["error"], "token") {
		t.Errorf("no token: %d %v", code, e)
	}
	if code := call(t, f.srv, "GET", "/api/inventory", nil, nil, "Authorization", "Bearer wrong"); code != 401 {
		t.Errorf("wrong token: %d", code)
	}
	if code := call(t, f.srv, "GET", "/api/inventory", nil, nil, "Authorization", "Bearer s3cret", "Host", "console.example:80"); code != 200 {
		t.Errorf("the bearer token, from another host name: %d", code)
	}
	// GET /?token= sets the cookie and sends the browser to /.
	code, cookie := login(t, f.srv, "s3cret")
	if code != http.StatusSeeOther || cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("GET /?token=: %d, cookie %+v", code, cookie)
	}
	if code := call(t, f.srv, "GET", "/api/inventory", nil, nil, "Cookie", cookie.Name+"="+cookie.Value); code != 200 {
		t.Errorf("with the cookie: %d", code)
	}
	if code, _ := login(t, f.srv, "nope"); code != 401 {
		t.Errorf("GET /?token=nope: %d", code)
	}

	auth := []string{"Authorization", "Bearer s3cret"}
	f.createVM(t, "app")
	// A write without the console's header (a form of another site).
	req, _ := http.NewRequest("POST", f.srv.URL+"/api/vms/app/power-off", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set("Content-Type", "application/json")
	if resp, err := f.srv.Client().Do(req); err != nil || resp.StatusCode != 403 {
		t.Errorf("a write without %s: %v %v", writeHeader, resp, err)
	}
	if code := call(t, f.srv, "POST", "/api/vms/app/power-off", struct{}{}, &e, append(auth, "Origin", "http://evil.example")...); code != 403 || !strings.Contains(e["error"], "origin") {
		t.Errorf("a write from another origin: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/vms/app/edit", map[string]any{"add_adapter": true}, &e, auth...); code != 400 || !strings.Contains(e["error"], "unknown field") {
		t.Errorf("an unknown field: %d %v", code, e)
	}
	if code := call(t, f.srv, "GET", "/api/vms/app/edit", nil, nil, auth...); code != http.StatusMethodNotAllowed {
		t.Errorf("GET on a write: %d", code)
	}
	var pw vrdma.PowerResult
	if code := call(t, f.srv, "POST", "/api/vms/app/power-on", struct{}{}, &pw, auth...); code != 200 || pw.Refused || !pw.Changed {
		t.Errorf("power-on with the token: %d %+v", code, pw)
	}

	// Without a token: only requests for a loopback name (no DNS rebinding).
	open := httptest.NewServer(New(Config{Socket: f.env.Socket, Cache: f.cache}))
	defer open.Close()
	if code := call(t, open, "GET", "/api/inventory", nil, nil, "Host", "rebound.example:8479"); code != http.StatusMisdirectedRequest {
		t.Errorf("a foreign Host without a token: %d", code)
	}
	for _, host := range []string{"localhost:8479", "[::1]:8479"} {
		if code := call(t, open, "GET", "/api/inventory", nil, nil, "Host", host); code != 200 {
			t.Errorf("Host %s: %d", host, code)
		}
	}
	resp, err := open.Client().Get(open.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "vrdma console") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("GET /: %d %s %q", resp.StatusCode, resp.Header, body)
	}

	for _, c := range []struct {
		addr, token string
		certs       bool
		ok          bool
	}{
		{"127.0.0.1:8479", "", false, true}, {"[::1]:0", "", false, true}, {"localhost:8479", "", false, true},
		{"0.0.0.0:8479", "", false, false}, {":8479", "", false, false}, {"192.0.2.1:8479", "", false, false},
		{"0.0.0.0:8479", "0123456789abcdef", false, true}, {"0.0.0.0:8479", "", true, true}, {"nowhere", "", true, false},
		{"0.0.0.0:8479", "t", false, false}, {"127.0.0.1:8479", "s3cret", false, false}, {"0.0.0.0:8479", "0123456789abcde", true, false},
	} {
		if err := CheckListen(c.addr, c.token, c.certs); (err == nil) != c.ok {
			t.Errorf("CheckListen(%q, %q, %v) = %v, want ok %v", c.addr, c.token, c.certs, err, c.ok)
		}
	}
}

// TestNetworkChecks checks GET /api/network: the RoCE network checks on
// the control plane's network, each with what to fix. The loopback
// uplink reports no DCB and declares nothing, so the lossless check is
// unknown and says what to declare.
func TestNetworkChecks(t *testing.T) {
	f := startFabric(t, "")
	var p NetworkPage
	if code := call(t, f.srv, "GET", "/api/network", nil, &p); code != 200 || p.OK || len(p.Switches) != 1 || p.Switches[0].Switch != "dvs1" {
		t.Fatalf("GET /api/network: %d %+v", code, p)
	}
	var l2 []netcheck.Result
	for _, r := range p.Switches[0].Results {
		if r.Check == netcheck.CheckL2Lossless {
			l2 = append(l2, r)
		}
	}
	if len(l2) == 0 || l2[0].Status != netcheck.Unknown || !strings.Contains(l2[0].Fix, "declare") {
		t.Errorf("roce-l2-lossless: %+v, want unknown with a fix that says what to declare", l2)
	}
	t.Logf("%d results, counts %v", len(p.Switches[0].Results), p.Counts)
}
