// SPDX-License-Identifier: Apache-2.0

package console

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
)

// The console in a real browser: headless Chromium (Debian's chromium)
// driven over the DevTools protocol, walking the procedures as an
// operator would, with clicks and keys.

// browser starts a headless Chromium with a fresh profile, w pixels
// wide, and returns a tab's context, bounded to a minute.
func browser(t *testing.T, w int, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getuid() != 0 {
			t.Skip("no chromium (apt-get install chromium): the browser tests need it")
		}
		t.Fatalf("no chromium: install it (apt-get install chromium; .ci/run does): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.Headless, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-gpu", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(w, 1000))
	opts = append(opts, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	tctx, tcancel := chromedp.NewContext(actx)
	t.Cleanup(tcancel)
	return tctx
}

// do runs steps, failing the test with what it was doing.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('main').innerText`))
		t.Fatalf("%s: %v\nthe page says:\n%s", what, err, text)
	}
}

// waitText waits until the element sel's text holds every one of want.
func waitText(sel string, want ...string) chromedp.Action[chromedp.Void] {
	w, _ := json.Marshal(want)
	return chromedp.Poll[chromedp.Void](`(() => { const e = document.querySelector(`+jsString(sel)+`); return !!e && `+string(w)+`.every(x => e.textContent.includes(x)); })()`,
		chromedp.WithPollingTimeout(15*time.Second), chromedp.WithPollingInterval(20*time.Millisecond))
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// screenshot saves the page as name in VRDMA_TEST_ARTIFACTS (or the
// test's temporary directory) and logs where.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(90))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("VRDMA_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", p, len(png))
}

// TestConsoleAddAdapter walks the add-adapter procedure in the browser:
// find the powered-off VM in the inventory (search), Edit Settings: add a
// PVRDMA adapter on a port group, reserve all guest memory, add an
// advanced parameter (a bad one is refused inline before saving), save
// (with the keyboard), power on.
func TestConsoleAddAdapter(t *testing.T) {
	f := startFabric(t, "")
	f.createVM(t, "web")
	f.createVM(t, "other")
	ctx := browser(t, 1000)
	do(t, ctx, "open the inventory",
		chromedp.Navigate(f.srv.URL+"/"),
		waitText("main", "Switch dvs1", "Port group dvportgroup-10", "VLAN 10", "PFC priority 3", "DSCP 26", "RoCE v2", "Host esx1", "VMs on no port group", "web", "other"),
		chromedp.SendKeys(chromedp.CSS("#search"), "web"),
		chromedp.WaitNotVisible(chromedp.CSS(`li[data-name="other"]`)),
		chromedp.WaitVisible(chromedp.CSS(`li[data-name="web"]`)),
		chromedp.Click(chromedp.CSS(`a[href="#/vm/web"]`)),
		waitText("main", "VM web", "powered off", "Edit Settings", "No PVRDMA adapter."),
		waitText("#checks", "No change yet"))

	do(t, ctx, "add the adapter",
		chromedp.SetValue(chromedp.CSS("#pg"), "dvportgroup-10"),
		chromedp.Click(chromedp.CSS("#add-adapter")),
		waitText("#pending-adapters", "PVRDMA on dvportgroup-10"),
		waitText("#checks", "The rules accept this change", "memory-reservation"))
	do(t, ctx, "reserve all guest memory",
		chromedp.Click(chromedp.CSS("#reserve")),
		chromedp.Poll[chromedp.Void](`!document.querySelector('#checks').textContent.includes('memory-reservation') && document.querySelector('#checks').textContent.includes('The rules accept')`,
			chromedp.WithPollingTimeout(15*time.Second)))
	do(t, ctx, "a parameter that breaks a rule is refused inline",
		chromedp.Click(chromedp.CSS("#add-row")),
		chromedp.SendKeys(chromedp.CSS("#k0"), "virtualHW.version"),
		chromedp.SendKeys(chromedp.CSS("#v0"), "10"),
		waitText("#checks", "Saving would be refused", "hw-version"))
	do(t, ctx, "remove that row, add vrdma.asyncMode = TRUE",
		chromedp.Click(chromedp.CSS("#edit tbody tr button")),
		chromedp.Click(chromedp.CSS("#add-row")),
		chromedp.SendKeys(chromedp.CSS("#k0"), "vrdma.asyncMode"),
		chromedp.SendKeys(chromedp.CSS("#v0"), "TRUE"),
		waitText("#checks", "The rules accept this change"))
	ctxA, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if in, err := f.ag.VM(ctxA, "web"); err != nil || strings.Contains(in.VMX, "ethernet0") {
		t.Fatalf("the checks stored the change before Save: %v\n%s", err, in.VMX)
	}
	do(t, ctx, "save with the keyboard",
		chromedp.SendKeys(chromedp.CSS("#save"), "\r"),
		waitText("#save-result", "Saved."),
		waitText("main", "Network adapter 1 (vrdma0): PVRDMA on dvportgroup-10"))
	in, err := f.ag.VM(ctxA, "web")
	if err != nil || !strings.Contains(in.VMX, `ethernet0.dvs.portgroupId = "dvportgroup-10"`) || !strings.Contains(in.VMX, `vrdma.asyncMode = "TRUE"`) ||
		!strings.Contains(in.VMX, `sched.mem.pin = "TRUE"`) || strings.Contains(in.VMX, `virtualHW.version = "10"`) {
		t.Fatalf("after Save the VMX is (%v):\n%s", err, in.VMX)
	}
	do(t, ctx, "power on",
		chromedp.Click(chromedp.CSS("#power-on")),
		waitText("#power-result", "VM web powered on on host esx1"),
		waitText("h1", "powered on"))
	if in, err := f.ag.VM(ctxA, "web"); err != nil || in.Power != "poweredOn" {
		t.Fatalf("after Power on: %+v %v", in, err)
	}
	do(t, ctx, "disconnect the adapter of a VM no workload runs: the agent's reason shows",
		chromedp.Click(chromedp.CSS("#adapters button.disconnect")),
		waitText("#save-result", "startConnected"))
	do(t, ctx, "a powered-on VM's settings do not change: the agent's reason shows",
		chromedp.Click(chromedp.CSS("#add-row")),
		chromedp.SendKeys(chromedp.CSS("#k0"), "vrdma.asyncMode"),
		chromedp.SendKeys(chromedp.CSS("#v0"), "FALSE"),
		waitText("#checks", "Cannot save", "power"))
	screenshot(t, ctx, "console-vm-web.png")
	do(t, ctx, "the host page",
		chromedp.Click(chromedp.CSS(`a[href^="#/host/"]`)),
		waitText("main", "Host esx1", testAddr+":4791", "pvrdma firewall rule", "enabled", "This agent"))
}

// TestConsoleRefusedPowerOn checks that a refused power-on lists every
// failed rule, on a phone-sized screen (360 pixels) that the page fits,
// and so do the network checks with their fixes.
func TestConsoleRefusedPowerOn(t *testing.T) {
	f := startFabric(t, "")
	f.createVM(t, "db")
	ctxA, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// An adapter on a port group but no memory reservation: the rule
	// fails on two keys.
	if _, err := f.ag.EditVM(ctxA, "db", vrdmaEdit()); err != nil {
		t.Fatal(err)
	}
	ctx := browser(t, 1000)
	do(t, ctx, "power on, refused",
		chromedp.EmulateViewport(360, 900),
		chromedp.Navigate(f.srv.URL+"/#/vm/db"),
		waitText("main", "VM db", "What the rules say now", "memory-reservation"),
		chromedp.Click(chromedp.CSS("#power-on")),
		waitText("#power-result", "Power on refused by the rules: 2 errors", "memory-reservation", "sched.mem.pin", "sched.mem.min"))
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#power-result li.error').length`))
	if err != nil || n < 2 {
		t.Errorf("the refusal lists %d failed rules (%v), want every one (at least 2)", n, err)
	}
	widths, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[window.innerWidth, document.documentElement.scrollWidth]`))
	if err != nil || len(widths) != 2 || widths[0] != 360 || widths[1] > widths[0] {
		t.Errorf("window and page widths %v (%v): want the page no wider than a 360-pixel window", widths, err)
	}
	screenshot(t, ctx, "console-refused-power-on.png")
	do(t, ctx, "the network checks, by the keyboard-reachable link",
		chromedp.Click(chromedp.CSS(`nav a[href="#/network"]`)),
		waitText("main", "Network checks", "Switch dvs1", "roce-l2-lossless", "unknown", "Fix:", "declare"))
	widths, err = chromedp.Run(ctx, chromedp.Evaluate[[]int](`[window.innerWidth, document.documentElement.scrollWidth]`))
	if err != nil || len(widths) != 2 || widths[1] > widths[0] {
		t.Errorf("network page: window and page widths %v (%v): want the page no wider than the window", widths, err)
	}
	if in, err := f.ag.VM(ctxA, "db"); err != nil || in.Power != "poweredOff" {
		t.Errorf("after the refused power-on: %+v %v", in, err)
	}
}

// vmOnPortGroup creates managed VM name, powered off, with an adapter
// on dvportgroup-10 and no memory reserved.
func (f *fabric) vmOnPortGroup(t *testing.T, name string) {
	t.Helper()
	f.createVM(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.ag.EditVM(ctx, name, vrdmaEdit()); err != nil {
		t.Fatal(err)
	}
}

// vrdmaEdit adds a PVRDMA adapter on dvportgroup-10 and reserves no
// memory.
func vrdmaEdit() vrdma.VMEdit {
	return vrdma.VMEdit{AddAdapters: []vrdma.NewAdapter{{PortGroup: "dvportgroup-10"}}}
}

// runningVM creates VM name with an adapter on dvportgroup-10 and its
// memory reserved, powers it on and attaches it.
func (f *fabric) runningVM(t *testing.T, name string) *vrdma.VM {
	t.Helper()
	f.createVM(t, name)
	return f.powerOn(t, f.ag, f.env.Socket, name)
}

// powerOn gives VM name, created on the agent ag at socket, an adapter
// on dvportgroup-10 and its memory reserved, powers it on and attaches
// it.
func (f *fabric) powerOn(t *testing.T, ag *vrdma.Agent, socket, name string) *vrdma.VM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	e := vrdmaEdit()
	e.ReserveAllMemory = true
	if _, err := ag.EditVM(ctx, name, e); err != nil {
		t.Fatal(err)
	}
	if _, err := ag.PowerOnVM(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	vm, err := vrdma.Open(ctx, name, vrdma.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() })
	return vm
}

// writeBW runs write_bw from VM from's vrdma0 to VM to's for up to 20
// seconds, on path want; stop ends it and checks that it ran.
func writeBW(t *testing.T, from, to *vrdma.VM, want vrdma.PathKind) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	t.Cleanup(cancel)
	ada, err := from.Adapter("vrdma0")
	if err != nil {
		t.Fatal(err)
	}
	adb, err := to.Adapter("vrdma0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := perf.Connect(ctx, ada, adb, perf.PairConfig{BufSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(ctx) })
	if got := p.Path().Path; got != want {
		t.Fatalf("path %q, want %s", got, want)
	}
	traffic, end := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() {
		_, err := p.Run(traffic, perf.Config{Test: perf.WriteBW, Size: 64 << 10, Duration: 20 * time.Second, UseEvent: true})
		ran <- err
	}()
	return func() {
		t.Helper()
		end()
		if err := <-ran; err != nil && traffic.Err() == nil {
			t.Errorf("write_bw: %v", err)
		}
	}
}

// TestConsoleLive watches traffic in the live view: two VMs on one host
// run write_bw, and the page shows their QPs on the memcpy path with
// the reason, and a throughput and an operation rate that are not zero,
// updated without a reload.
func TestConsoleLive(t *testing.T) {
	f := startFabric(t, "")
	stop := writeBW(t, f.runningVM(t, "left"), f.runningVM(t, "right"), vrdma.PathMemcpy)
	bctx := browser(t, 1000)
	do(t, bctx, "the live view with traffic",
		chromedp.Navigate(f.srv.URL+"/#/live"),
		waitText("main", "VM left", "VM right", "memcpy", "same host"),
		// The rate is measured between two polls: wait for one above zero.
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('.rate')].some(e => !e.textContent.includes(' 0.00 MB/s')) && [...document.querySelectorAll('.ops-rate')].some(e => !e.textContent.includes(' 0 per'))`,
			chromedp.WithPollingTimeout(15*time.Second)))
	screenshot(t, bctx, "console-live.png")
	before, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('.rate').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	do(t, bctx, "the view updates by itself",
		chromedp.Poll[chromedp.Void](`document.querySelector('.rate').textContent !== `+jsString(before), chromedp.WithPollingTimeout(5*time.Second)))
	do(t, bctx, "explain the path between the two",
		chromedp.SendKeys(chromedp.CSS("#path-a"), "left/vrdma0"),
		chromedp.SendKeys(chromedp.CSS("#path-b"), "right/vrdma0"),
		chromedp.Click(chromedp.CSS("#explain-go")),
		waitText("#path-result", "left/vrdma0 ↔ right/vrdma0: memcpy", "same host", "rejected rdma", "rejected tcp"))
	stop()
}

// TestConsoleToken checks the token in a browser: without it the pages
// say how to get in; the address vrdmactl console prints lets the
// browser in (the token's cookie) and the inventory shows; and a saved
// removal of an adapter takes it off the VM.
func TestConsoleToken(t *testing.T) {
	f := startFabric(t, "s3cret")
	f.vmOnPortGroup(t, "web")
	ctxA, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx := browser(t, 1000)
	do(t, ctx, "no token",
		chromedp.Navigate(f.srv.URL+"/"),
		waitText("main", "no or wrong token"))
	do(t, ctx, "the printed address",
		chromedp.Navigate(f.srv.URL+"/?token=s3cret"),
		waitText("main", "Switch dvs1", "Host esx1"),
		chromedp.Poll[chromedp.Void](`location.search === ''`, chromedp.WithPollingTimeout(5*time.Second)))
	do(t, ctx, "remove the adapter",
		chromedp.Click(chromedp.CSS(`a[href="#/vm/web"]`)),
		waitText("#adapters", "Network adapter 1 (vrdma0)"),
		chromedp.Click(chromedp.CSS(`#adapters button`)),
		waitText("#adapters", "removed when you save"),
		waitText("#checks", "The rules accept this change"),
		chromedp.Click(chromedp.CSS("#save")),
		waitText("#save-result", "Saved."),
		waitText("main", "No PVRDMA adapter."))
	if in, err := f.ag.VM(ctxA, "web"); err != nil || strings.Contains(in.VMX, "ethernet0") {
		t.Errorf("after removing the adapter: %v\n%s", err, in.VMX)
	}
}

// stayHome fails the test at its end if the tab of ctx asked for
// anything but the console at base (or a data: URL): the pages make no
// request elsewhere.
func stayHome(t *testing.T, ctx context.Context, base string) {
	t.Helper()
	var mu sync.Mutex
	var away []string
	err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok && !strings.HasPrefix(e.Request.URL, base+"/") && !strings.HasPrefix(e.Request.URL, "data:") {
			mu.Lock()
			away = append(away, e.Request.URL)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if len(away) > 0 {
			t.Errorf("the pages asked for %v: want nothing but the console at %s", away, base)
		}
	})
}

// pageFits checks that the page is no wider than the window.
func pageFits(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	widths, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[window.innerWidth, document.documentElement.scrollWidth]`))
	if err != nil || len(widths) != 2 || widths[1] > widths[0] {
		t.Errorf("%s: window and page widths %v (%v): want the page no wider than the window", what, widths, err)
	}
}

// TestConsoleHostConfigure walks "Configure an ESXi host for PVRDMA" in
// the browser, on a 360-pixel screen, with the keyboard: a bad address
// is refused with the reason; then tag another address, turn the pvrdma
// firewall rule off and PVRDMA namespaces on, save, and the agent
// applies it; then declare the uplink's PFC and pause.
func TestConsoleHostConfigure(t *testing.T) {
	f := startFabric(t, "")
	id := f.env.Status(t).HostID
	ctx := browser(t, 1000)
	stayHome(t, ctx, f.srv.URL)
	do(t, ctx, "the host page's form",
		chromedp.EmulateViewport(360, 900),
		chromedp.Navigate(f.srv.URL+"/#/host/"+id),
		waitText("main", "Host esx1", "Configure for PVRDMA", "PVRDMA namespaces", "off"))
	pageFits(t, ctx, "host page")
	do(t, ctx, "a bad address is refused, with the reason",
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#cf-addr').value = ''`),
		chromedp.SendKeys(chromedp.CSS("#cf-addr"), "nowhere\r"),
		waitText("#configure-result", "Not configured", "ADDRESS:PORT"))
	do(t, ctx, "tag another address, the rule off, namespaces on: by the keyboard",
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#cf-addr').value = ''`),
		chromedp.SendKeys(chromedp.CSS("#cf-addr"), testAddr+":4794"),
		chromedp.Focus(chromedp.CSS("#cf-fw")), chromedp.KeyEvent(" "),
		chromedp.Focus(chromedp.CSS("#cf-ns")), chromedp.KeyEvent(" "),
		chromedp.Focus(chromedp.CSS("#configure-save")), chromedp.KeyEvent("\r"),
		waitText("#configure-result", "Host esx1 configured: pvrdma_address, firewall_pvrdma, pvrdma_namespaces"),
		waitText("main", testAddr+":4794", "disabled"),
		chromedp.Poll[chromedp.Void](`document.querySelector('#cf-ns').checked && !document.querySelector('#cf-fw').checked`, chromedp.WithPollingTimeout(5*time.Second)))
	deadline := time.Now().Add(10 * time.Second)
	for p := f.env.Status(t).PVRDMA; p == nil || p.Firewall || p.Address != testAddr+":4794"; p = f.env.Status(t).PVRDMA {
		if time.Now().After(deadline) {
			t.Fatalf("the agent 10 s after the host was configured: %+v", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	do(t, ctx, "declare the uplink's lossless state",
		chromedp.SendKeys(chromedp.CSS("#dc-pfc"), "3"),
		chromedp.SetValue(chromedp.CSS("#dc-pause"), "off"),
		chromedp.Focus(chromedp.CSS("#declare-save")), chromedp.KeyEvent("\r"),
		waitText("#declare-result", "Uplink "+testAddr+" declares: pfc 3, pause off."),
		waitText("#declare", "pfc 3, pause off"))
	pageFits(t, ctx, "host page after configure")
	screenshot(t, ctx, "console-host-configure.png")
}

// TestConsoleCreateObjects creates a switch, a port group on it and a
// VM from the browser, on a 360-pixel screen, changes the port group's
// and the switch's settings (a bad subnet is refused with the reason),
// is refused deleting the switch and a port group in use (the reason
// shows), then deletes them all.
func TestConsoleCreateObjects(t *testing.T) {
	f := startFabric(t, "")
	f.vmOnPortGroup(t, "web")
	ctx := browser(t, 1000)
	stayHome(t, ctx, f.srv.URL)
	do(t, ctx, "create a switch",
		chromedp.EmulateViewport(360, 900),
		chromedp.Navigate(f.srv.URL+"/"),
		waitText("main", "Switch dvs1", "Create"),
		chromedp.Focus(chromedp.CSS("details:has(#new-switch) > summary")), chromedp.KeyEvent("\r"),
		chromedp.WaitVisible(chromedp.CSS("#sw-name")),
		chromedp.SendKeys(chromedp.CSS("#sw-name"), "dvs9"),
		chromedp.SetValue(chromedp.CSS("#sw-mtu"), "1500"),
		chromedp.SendKeys(chromedp.CSS("#sw-mtu"), "\r"),
		waitText("#admin-result", "Switch dvs9 created."),
		waitText("main", "Switch dvs9", "MTU 1500"))
	do(t, ctx, "create a port group on it",
		chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('#create-h ~ details').forEach(d => d.open = true)`),
		chromedp.SendKeys(chromedp.CSS("#pg-key"), "dvportgroup-90"),
		chromedp.SetValue(chromedp.CSS("#pg-switch"), "dvs9"),
		chromedp.SetValue(chromedp.CSS("#pg-vlan"), "90"),
		chromedp.SetValue(chromedp.CSS("#pg-pfc"), "5"),
		chromedp.SetValue(chromedp.CSS("#pg-dscp"), "40"),
		chromedp.SetValue(chromedp.CSS("#pg-roce"), "v1"),
		chromedp.Click(chromedp.CSS("#new-pg button[type=submit]")),
		waitText("#admin-result", "Port group dvportgroup-90 created."),
		waitText("main", "Port group dvportgroup-90", "VLAN 90 · PFC priority 5 · DSCP 40 · RoCE v1"),
		chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('#create-h ~ details').forEach(d => d.open = true)`))
	pageFits(t, ctx, "the inventory with the create forms open")
	screenshot(t, ctx, "console-create.png")
	do(t, ctx, "change the port group's settings; a bad subnet is refused with the reason",
		chromedp.Click(chromedp.CSS(`a[href="#/portgroup/dvportgroup-90"]`)),
		waitText("main", "Port group dvportgroup-90", "On switch dvs9"),
		chromedp.SendKeys(chromedp.CSS("#set-subnet"), "10.1.0.0/99\r"),
		waitText("#set-result", "Not saved", "subnet"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#set-subnet').value = ''`),
		chromedp.SetValue(chromedp.CSS("#set-vlan"), "91"),
		chromedp.SetValue(chromedp.CSS("#set-roce_version"), "v2"),
		chromedp.Click(chromedp.CSS("#set-save")),
		waitText("#set-result", "Port group dvportgroup-90 saved: vlan, roce_version."),
		chromedp.Click(chromedp.CSS(`nav a[href="#/"]`)),
		waitText("main", "VLAN 91 · PFC priority 5 · DSCP 40 · RoCE v2"))
	do(t, ctx, "the switch's network policy",
		chromedp.Click(chromedp.CSS(`a[href="#/switch/dvs9"]`)),
		waitText("main", "Switch dvs9", "Network policy"),
		chromedp.SetValue(chromedp.CSS("#set-network_policy"), "warn"),
		chromedp.Click(chromedp.CSS("#set-save")),
		waitText("#set-result", "Switch dvs9 saved: network_policy."),
		chromedp.Click(chromedp.CSS(`nav a[href="#/"]`)),
		waitText("main", "Switch dvs9 MTU 1500 · network policy warn"))
	do(t, ctx, "a switch with a port group is not deleted: the reason shows",
		chromedp.Click(chromedp.CSS(`button[data-delete="switch dvs9"]`)),
		waitText("#admin-result", "Refused", "port groups dvportgroup-90 are on it"))
	do(t, ctx, "a port group with an adapter on it is not deleted: the reason shows",
		chromedp.Click(chromedp.CSS(`button[data-delete="port group dvportgroup-10"]`)),
		waitText("#admin-result", "Refused", "adapters web/vrdma0 are on it"))
	do(t, ctx, "create a VM",
		chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('#create-h ~ details').forEach(d => d.open = true)`),
		chromedp.SendKeys(chromedp.CSS("#vm-name"), "app"),
		chromedp.SetValue(chromedp.CSS("#vm-mem"), "4"),
		chromedp.SetValue(chromedp.CSS("#vm-host"), f.env.Status(t).HostID),
		chromedp.Click(chromedp.CSS("#new-vm button[type=submit]")),
		waitText("#admin-result", "VM app created"),
		waitText("main", "VMs on no port group"),
		chromedp.WaitVisible(chromedp.CSS(`li[data-name="app"]`)))
	// A deadline of its own: the steps above may take a while on a
	// busy machine.
	ctxA, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if in, err := f.ag.VM(ctxA, "app"); err != nil || !in.Managed || in.Power != "poweredOff" || !strings.Contains(in.VMX, `memSize = "4"`) {
		t.Fatalf("VM app after Create: %+v %v", in, err)
	}
	do(t, ctx, "delete the port group, then the switch",
		chromedp.Click(chromedp.CSS(`button[data-delete="port group dvportgroup-90"]`)),
		waitText("#admin-result", "Port group dvportgroup-90 deleted."),
		chromedp.Click(chromedp.CSS(`button[data-delete="switch dvs9"]`)),
		waitText("#admin-result", "Switch dvs9 deleted."))
	do(t, ctx, "delete the VM from its page",
		chromedp.Click(chromedp.CSS(`a[href="#/vm/app"]`)),
		waitText("main", "VM app", "Delete VM"),
		chromedp.Click(chromedp.CSS("#delete-vm")),
		waitText("#admin-result", "VM app deleted."))
	if _, err := f.ag.VM(ctxA, "app"); err == nil {
		t.Errorf("VM app is still there after Delete VM")
	}
	for _, k := range []string{"dvs9"} {
		if _, err := f.cache.Switch(ctxA, k); err == nil {
			t.Errorf("switch %s is still there after Delete", k)
		}
	}
}

// TestConsoleMap watches two hosts in the live view: a VM on each, the
// second host's agent read as another agent of the console, write_bw
// from the second host's VM to the first's on the tcp path. The map shows both hosts and the tcp
// edge with traffic; the remote VM shows its QP and its charts.
func TestConsoleMap(t *testing.T) {
	f := startFabric(t, "")
	env2, ag2 := f.addHost(t, "esx2", "127.0.38.2")
	f.reconfigure(t, func(c *Config) { c.Agents = []string{env2.Socket} })
	a := f.runningVM(t, "left")
	f.createVMOn(t, ag2, "right")
	b := f.powerOn(t, ag2, env2.Socket, "right")
	stop := writeBW(t, b, a, vrdma.PathTCP)
	bctx := browser(t, 1000)
	stayHome(t, bctx, f.srv.URL)
	do(t, bctx, "the map with the tcp edge and its traffic",
		chromedp.Navigate(f.srv.URL+"/#/live"),
		waitText("#map", "esx1", "esx2"),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#edges li')].some(e => /^esx[12] ↔ esx[12]: tcp · 2 QPs · /.test(e.textContent) && !e.textContent.endsWith(' 0.00 MB/s'))`,
			chromedp.WithPollingTimeout(15*time.Second)),
		chromedp.WaitVisible(chromedp.CSS("svg.map line.edge.tcp")))
	do(t, bctx, "the remote VM's QP and charts",
		waitText("main", "VM right", "on host esx2", "VM left", "on host esx1"),
		chromedp.Poll[chromedp.Void](`(() => { const s = [...document.querySelectorAll('section')].find(x => x.getAttribute('aria-label') === 'VM right'); return !!s && s.querySelector('canvas') && s.textContent.includes('tcp') && !s.querySelector('.rate').textContent.includes(' 0.00 MB/s'); })()`,
			chromedp.WithPollingTimeout(15*time.Second)))
	screenshot(t, bctx, "console-map.png")
	do(t, bctx, "the remote host's page, by the keyboard from the map, shows its agent's uplink",
		chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll('svg.map a')].find(a => a.textContent.startsWith('esx2')).focus()`),
		// The map is drawn again every second: the focus stays on the host.
		chromedp.Sleep(1500*time.Millisecond),
		chromedp.Poll[chromedp.Void](`document.activeElement.closest('svg.map') !== null && document.activeElement.textContent.startsWith('esx2')`, chromedp.WithPollingTimeout(time.Second)),
		chromedp.KeyEvent("\r"),
		waitText("main", "Host esx2", "Its agent", "TCP uplinks to other hosts", "esx1", "up"))
	stop()
}
