// SPDX-License-Identifier: Apache-2.0

package cli

// vrdmactl doctor: checks of this host, each with what
// it looked at and how to fix what fails. Every check is made from here,
// against the agent at --socket and the control plane vrdmactl finds; none
// changes anything.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma"
)

// Doctor check outcomes.
const (
	checkPass = "pass"
	checkWarn = "warn" // works, but something may bite; the exit status stays 0
	checkFail = "fail" // something vrdma needs is missing; exit status 1
)

// RoCEv2's UDP port (IANA), where an RDMA uplink's engine listens.
const roceUDPPort = 4791

// doctorCheck is one check's outcome.
type doctorCheck struct {
	Name   string `json:"name"`
	Status string `json:"status"` // pass, warn or fail
	Detail string `json:"detail"` // what was looked at, and what was found
	Fix    string `json:"fix,omitempty"`
}

// doctorReport is what doctor prints (-o json).
type doctorReport struct {
	OK       bool          `json:"ok"` // no check failed
	Failed   int           `json:"failed"`
	Warnings int           `json:"warnings"`
	Checks   []doctorCheck `json:"checks"`
}

// doctorAgent is what the agent check learned, for the checks after it.
type doctorAgent struct {
	pid    int // from SO_PEERCRED; 0 if unknown
	info   vrdma.AgentInfo
	status *vrdma.Status // nil if the agent did not answer
}

func (a *app) doctorCommand() *cobra.Command {
	var planned []string
	cmd := &cobra.Command{
		Use:   "doctor [--rdma-uplink ADDR]...",
		Short: "Check this host: agent, memory-lock limit, control plane, uplinks, UDP 4791, clock",
		Long: `doctor checks what vrdma needs on this host and prints, for each check, pass,
warn or fail, what it looked at, and what to do about a failure:

  agent          an agent answers on --socket (the socket exists, a process
                 listens, it speaks vrdma); its release, host and pid
  memlock        the agent's memory-lock limit (RLIMIT_MEMLOCK, read from
                 /proc/PID/limits) against the guest memory its VMs reserve
                 and lock (sched.mem.pin); CAP_IPC_LOCK lifts the limit.
                 Without an agent, this process's limit, which an agent
                 started from this shell would inherit
  control-plane  etcd answers at the endpoints vrdmactl uses (--etcd-endpoints,
                 or the local agent's embedded etcd under --state-dir): each
                 endpoint's status, then a linearizable read
  uplinks        the agent's PVRDMA address and RDMA uplink addresses (and
                 any --rdma-uplink ADDR) are addresses of this host: a socket
                 binds to each
  port-4791      who holds UDP 4791 (RoCEv2), from /proc/net/udp and udp6 and
                 the sockets of /proc/PID/fd: on an RDMA uplink's address only
                 vrdmad may; another process there fails, elsewhere warns
  clock          CLOCK_MONOTONIC and CLOCK_BOOTTIME advance (the RC timers and
                 leases run on them), and the kernel's NTP state (adjtimex):
                 an unsynchronized clock warns. The offset from other hosts'
                 clocks is not measured

--rdma-uplink ADDR checks an address before vrdmad is started with
--rdma-uplink rocev2-soft/ADDR: that it is local and that UDP 4791 is free
there.

doctor exits 0 when no check fails (warnings allowed), 1 when one fails; -o
json prints the report whatever the exit status. Run it as root to name the
processes of other users that hold UDP 4791.`,
		Example: `  vrdmactl doctor
  vrdmactl doctor -o json
  vrdmactl doctor --rdma-uplink 192.168.50.11      # before vrdmad --rdma-uplink rocev2-soft/192.168.50.11
  vrdmactl doctor --socket /run/vrdma/vrdmad.sock --etcd-endpoints https://etcd1:2379`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var plan []netip.Addr
			for _, s := range planned {
				ip, err := netip.ParseAddr(s)
				if err != nil {
					return usageErrorf("--rdma-uplink %q: want an IP address: %v", s, err)
				}
				plan = append(plan, ip.Unmap())
			}
			rep := a.doctor(cmd.Context(), plan)
			if a.json() {
				if err := a.printJSON(rep); err != nil {
					return err
				}
			} else {
				printDoctor(a, rep)
			}
			if !rep.OK {
				return &exitError{code: exitFailure}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&planned, "rdma-uplink", nil, "an address an RDMA uplink is to use (repeatable): check it is local and UDP 4791 is free there")
	return cmd
}

func printDoctor(a *app, rep doctorReport) {
	for _, c := range rep.Checks {
		fmt.Fprintf(a.stdout, "%-4s  %-13s  %s\n", strings.ToUpper(c.Status), c.Name, c.Detail)
		if c.Fix != "" {
			fmt.Fprintf(a.stdout, "      %-13s  fix: %s\n", "", c.Fix)
		}
	}
	fmt.Fprintf(a.stdout, "%d checks: %d failed, %d warnings\n", len(rep.Checks), rep.Failed, rep.Warnings)
}

// doctor runs every check.
func (a *app) doctor(ctx context.Context, planned []netip.Addr) doctorReport {
	ag, agentCheck := a.checkAgent(ctx)
	checks := []doctorCheck{
		agentCheck,
		checkMemlock(ag),
		a.checkControlPlane(ctx, ag),
	}
	uplinks := uplinkAddrs(ag, planned)
	checks = append(checks, checkUplinks(ag, uplinks), checkRoCEPort(ag, uplinks), checkClock())
	rep := doctorReport{Checks: checks}
	for _, c := range checks {
		switch c.Status {
		case checkFail:
			rep.Failed++
		case checkWarn:
			rep.Warnings++
		}
	}
	rep.OK = rep.Failed == 0
	return rep
}

// checkAgent connects to the agent: first a bare connection, for the
// peer's credentials and a precise error, then a hello and a status.
func (a *app) checkAgent(ctx context.Context) (*doctorAgent, doctorCheck) {
	c := doctorCheck{Name: "agent"}
	fail := func(detail, fix string) (*doctorAgent, doctorCheck) {
		c.Status, c.Detail, c.Fix = checkFail, detail, fix
		return nil, c
	}
	start := "start the agent (systemctl start vrdmad, or vrdmad), or name its socket with --socket or VRDMA_SOCKET"
	conn, err := net.DialTimeout("unixpacket", a.socket, 2*time.Second)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return fail(fmt.Sprintf("no agent: %s does not exist", a.socket), start)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fail(fmt.Sprintf("no agent: %s exists but no process listens on it (an agent that died left it)", a.socket),
			"restart vrdmad (systemctl restart vrdmad): it replaces a stale socket")
	case errors.Is(err, syscall.EACCES):
		return fail(fmt.Sprintf("cannot reach the agent: %v", err), "run vrdmactl as a user that may enter the socket's directory, or as root")
	case err != nil:
		return fail(fmt.Sprintf("cannot connect to %s: %v", a.socket, err), start)
	}
	ag := &doctorAgent{pid: peerPID(conn)}
	conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cl, err := vrdma.DialAgent(ctx, vrdma.WithSocket(a.socket))
	if err != nil {
		return fail(fmt.Sprintf("a process (pid %d) listens on %s but does not answer as a vrdma agent: %v", ag.pid, a.socket, err),
			"check that the process is vrdmad of this release (vrdmad --version), and restart it")
	}
	defer cl.Close()
	ag.info = cl.Info
	st, err := cl.Status(ctx)
	if err != nil {
		return fail(fmt.Sprintf("vrdmad %s (pid %d) answered the hello but not a status: %v", cl.Info.AgentVersion, ag.pid, err),
			"look at the agent's log (journalctl -u vrdmad)")
	}
	ag.status = &st
	c.Status = checkPass
	c.Detail = fmt.Sprintf("vrdmad %s, host %s, pid %d, at %s: %d VMs", cl.Info.AgentVersion, cl.Info.Host, ag.pid, a.socket, len(st.VMs))
	return ag, c
}

// peerPID returns the pid of the process at the other end of a Unix
// socket (SO_PEERCRED), or 0.
func peerPID(c net.Conn) int {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	rc.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// memlockOf returns the soft RLIMIT_MEMLOCK of process pid (0: this
// process) in bytes, unlimited, and whether it holds CAP_IPC_LOCK in its
// effective set, read from /proc.
func memlockOf(pid int) (limit uint64, unlimited, capIPCLock bool, err error) {
	dir := "/proc/self"
	if pid > 0 {
		dir = "/proc/" + strconv.Itoa(pid)
	}
	b, err := os.ReadFile(filepath.Join(dir, "limits"))
	if err != nil {
		return 0, false, false, err
	}
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max locked memory"); ok {
			f := strings.Fields(rest)
			if len(f) < 1 {
				break
			}
			found = true
			if f[0] == "unlimited" {
				unlimited = true
			} else if limit, err = strconv.ParseUint(f[0], 10, 64); err != nil {
				return 0, false, false, fmt.Errorf("%s/limits: Max locked memory %q: %v", dir, f[0], err)
			}
		}
	}
	if !found {
		return 0, false, false, fmt.Errorf("%s/limits has no Max locked memory line", dir)
	}
	b, err = os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return 0, false, false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, false, false, fmt.Errorf("%s/status: CapEff %q: %v", dir, v, err)
			}
			capIPCLock = caps&(1<<unix.CAP_IPC_LOCK) != 0
		}
	}
	return limit, unlimited, capIPCLock, nil
}

func fmtLimit(limit uint64, unlimited bool) string {
	if unlimited {
		return "unlimited"
	}
	if limit < 1<<20 {
		return fmt.Sprintf("%d KiB", limit>>10)
	}
	return mib(limit)
}

// checkMemlock compares the agent's memory-lock limit with the guest
// memory its VMs lock.
func checkMemlock(ag *doctorAgent) doctorCheck {
	c := doctorCheck{Name: "memlock"}
	if ag == nil || ag.pid == 0 {
		why := "no agent to read the limit of"
		if ag != nil {
			why = "the agent's pid is unknown (SO_PEERCRED failed), so its limit cannot be read"
		}
		limit, unl, capLock, err := memlockOf(0)
		c.Status = checkWarn
		if err != nil {
			c.Detail = fmt.Sprintf("%s, nor this process's: %v", why, err)
			return c
		}
		held := ""
		if capLock {
			held = " (it holds CAP_IPC_LOCK, which lifts the limit)"
		}
		c.Detail = fmt.Sprintf("%s; this process may lock %s%s, and an agent started from this shell would inherit the limit",
			why, fmtLimit(limit, unl), held)
		c.Fix = "the systemd unit (contrib/vrdmad.service) sets LimitMEMLOCK=infinity; elsewhere raise it with ulimit -l before starting vrdmad"
		return c
	}
	limit, unl, capLock, err := memlockOf(ag.pid)
	if err != nil {
		c.Status, c.Detail = checkWarn, fmt.Sprintf("cannot read the agent's (pid %d) limit: %v", ag.pid, err)
		c.Fix = "run vrdmactl doctor on the agent's host, in its PID namespace"
		return c
	}
	var need uint64
	var who []string
	if ag.status != nil {
		for _, v := range ag.status.VMs {
			if v.MemReserved || v.MemLocked {
				need += v.MemSize
				who = append(who, fmt.Sprintf("%s %s", v.Name, mib(v.MemSize)))
			}
		}
	}
	lim := fmtLimit(limit, unl)
	switch {
	case need == 0:
		c.Status, c.Detail = checkPass, fmt.Sprintf("the agent (pid %d) may lock %s; no VM of this host reserves and locks its memory", ag.pid, lim)
	case capLock:
		c.Status, c.Detail = checkPass, fmt.Sprintf("the agent (pid %d) holds CAP_IPC_LOCK, so its limit (%s) does not apply; its VMs lock %s (%s)",
			ag.pid, lim, mib(need), strings.Join(who, ", "))
	case unl || need <= limit:
		c.Status, c.Detail = checkPass, fmt.Sprintf("the agent (pid %d) may lock %s; its VMs lock %s (%s)", ag.pid, lim, mib(need), strings.Join(who, ", "))
	default:
		c.Status = checkFail
		c.Detail = fmt.Sprintf("the agent (pid %d) may lock %s (RLIMIT_MEMLOCK) and lacks CAP_IPC_LOCK, but its VMs reserve and lock %s (%s): attaching them fails",
			ag.pid, lim, mib(need), strings.Join(who, ", "))
		c.Fix = fmt.Sprintf("raise the agent's limit to at least %s: LimitMEMLOCK=infinity in its systemd unit, or ulimit -l before starting it; or drop sched.mem.pin from VMs that need not be locked", mib(need))
	}
	return c
}

// checkControlPlane asks each etcd endpoint for its status, then makes a
// linearizable read through all of them.
func (a *app) checkControlPlane(ctx context.Context, ag *doctorAgent) doctorCheck {
	c := doctorCheck{Name: "control-plane"}
	standalone := ag != nil && ag.status != nil && ag.status.PVRDMA == nil
	_, err := a.controlEndpoints()
	if err != nil {
		if standalone {
			c.Status = checkWarn
			c.Detail = "the agent runs without a control plane (--no-control-plane): its VMs reach peers of this host only"
			c.Fix = "to reach other hosts, start vrdmad with --etcd-endpoints (or without --no-control-plane for an embedded etcd)"
			return c
		}
		c.Status, c.Detail = checkFail, err.Error()
		c.Fix = "pass --etcd-endpoints (the agent's) or --state-dir (the agent's state directory)"
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	st, err := a.openStore(ctx)
	if err != nil {
		c.Status, c.Detail = checkFail, err.Error()
		c.Fix = "check the endpoints and the TLS flags (--etcd-cert, --etcd-key, --etcd-ca)"
		return c
	}
	defer st.Close()
	var ok, bad []string
	for _, ep := range st.Endpoints() {
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		s, err := st.Client().Status(sctx, ep)
		scancel()
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", ep, st.Classify(err)))
			continue
		}
		leader := "no leader"
		if s.Leader != 0 {
			leader = fmt.Sprintf("leader %x", s.Leader)
		}
		ok = append(ok, fmt.Sprintf("%s (etcd %s, %s)", ep, s.Version, leader))
	}
	if len(ok) == 0 {
		c.Status, c.Detail = checkFail, "no etcd endpoint answers: "+strings.Join(bad, "; ")
		c.Fix = "start etcd (or the agent, for its embedded etcd), or fix --etcd-endpoints; check the network and firewall to port 2379"
		return c
	}
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = st.Client().Get(rctx, "doctor-probe", clientv3.WithCountOnly())
	rcancel()
	if err != nil {
		c.Status = checkFail
		c.Detail = fmt.Sprintf("etcd answers (%s) but a linearizable read fails: %v", strings.Join(ok, ", "), st.Classify(err))
		c.Fix = "the cluster has no quorum: bring back a majority of its members"
		return c
	}
	c.Status, c.Detail = checkPass, "etcd answers: "+strings.Join(ok, ", ")
	if len(bad) > 0 {
		c.Status = checkWarn
		c.Detail += "; but not: " + strings.Join(bad, "; ")
		c.Fix = "bring back the members that do not answer, or drop them from --etcd-endpoints"
	}
	return c
}

// uplinkAddr is an address this host should own, and what it is for.
type uplinkAddr struct {
	ip   netip.Addr
	what string // "PVRDMA address", "RDMA uplink", "--rdma-uplink"
	rdma bool   // UDP 4791 there is an RDMA uplink's
	// agentHolds: the agent reports an engine on it, so the agent
	// should hold UDP 4791 there.
	agentHolds bool
}

func uplinkAddrs(ag *doctorAgent, planned []netip.Addr) []uplinkAddr {
	var out []uplinkAddr
	if ag != nil && ag.status != nil {
		if p := ag.status.PVRDMA; p != nil && p.Address != "" {
			if ap, err := netip.ParseAddrPort(p.Address); err == nil {
				out = append(out, uplinkAddr{ip: ap.Addr().Unmap(), what: "PVRDMA address " + p.Address})
			}
		}
		for _, r := range ag.status.RDMA {
			if ap, err := netip.ParseAddrPort(r.Address); err == nil {
				out = append(out, uplinkAddr{ip: ap.Addr().Unmap(), what: "RDMA uplink " + r.Address, rdma: true, agentHolds: true})
			}
		}
	}
	for _, ip := range planned {
		out = append(out, uplinkAddr{ip: ip, what: "--rdma-uplink " + ip.String(), rdma: true})
	}
	return out
}

// checkUplinks checks that every uplink address is one of this host's: a
// UDP socket binds to it (port 0), which the kernel refuses
// (EADDRNOTAVAIL) for an address no interface has.
func checkUplinks(ag *doctorAgent, addrs []uplinkAddr) doctorCheck {
	c := doctorCheck{Name: "uplinks"}
	if ag != nil && ag.status != nil && ag.status.PVRDMA != nil && ag.status.PVRDMA.Error != "" {
		c.Status = checkFail
		c.Detail = "the agent does not listen on its PVRDMA address: " + ag.status.PVRDMA.Error
		c.Fix = "give the address to a NIC of this host (ip addr add), or correct it: vrdmactl host configure HOST --pvrdma-address ADDR:PORT"
		return c
	}
	if len(addrs) == 0 {
		c.Status = checkPass
		c.Detail = "no PVRDMA address or RDMA uplink to check (none configured, or no agent to ask)"
		if ag != nil && ag.status != nil && ag.status.PVRDMA != nil {
			c.Status = checkWarn
			c.Detail = "the agent has a control plane but no PVRDMA address: its VMs reach no other host"
			c.Fix = "vrdmactl host configure HOST --pvrdma-address ADDR:PORT --firewall-pvrdma on"
		}
		return c
	}
	var ok, bad []string
	for _, u := range addrs {
		pc, err := net.ListenPacket("udp", netip.AddrPortFrom(u.ip, 0).String())
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %s is not an address of this host (%v)", u.what, u.ip, err))
			continue
		}
		pc.Close()
		ok = append(ok, fmt.Sprintf("%s on %s", u.what, ifaceOf(u.ip)))
	}
	if len(bad) > 0 {
		c.Status, c.Detail = checkFail, strings.Join(bad, "; ")
		if len(ok) > 0 {
			c.Detail += "; bound: " + strings.Join(ok, ", ")
		}
		c.Fix = "add the address to the NIC of that network (ip addr add ADDR/PREFIX dev DEV), or start vrdmad with an address of this host"
		return c
	}
	c.Status, c.Detail = checkPass, "bound: "+strings.Join(ok, ", ")
	return c
}

// ifaceOf names the interface that has ip, or "a local address".
func ifaceOf(ip netip.Addr) string {
	ifs, err := net.Interfaces()
	if err != nil {
		return "a local address"
	}
	for _, ifc := range ifs {
		as, _ := ifc.Addrs()
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if p, err := netip.ParsePrefix(n.String()); err == nil && (p.Addr().Unmap() == ip || (ifc.Flags&net.FlagLoopback != 0 && p.Contains(ip))) {
					return ifc.Name
				}
			}
		}
	}
	return "a local address"
}

// udpHolder is a UDP socket bound to port 4791, from /proc/net/udp{,6}.
type udpHolder struct {
	addr  netip.Addr // the local address; unspecified for a wildcard bind
	inode uint64
	pid   int // 0: not found (another user's process, seen only by root)
	comm  string
}

func (h udpHolder) who() string {
	if h.pid == 0 {
		return "a process vrdmactl cannot see (run doctor as root to name it)"
	}
	return fmt.Sprintf("pid %d (%s)", h.pid, h.comm)
}

// udpHolders lists the sockets bound to UDP port on this network
// namespace, with the process that owns each when /proc shows it.
func udpHolders(port int) ([]udpHolder, error) {
	var out []udpHolder
	for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		hs, err := parseProcUDP(f, port)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		out = append(out, hs...)
	}
	if len(out) == 0 {
		return nil, nil
	}
	byInode := map[uint64]int{}
	for i, h := range out {
		byInode[h.inode] = i
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(l, "socket:[") {
				continue
			}
			ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"), 10, 64)
			if err != nil {
				continue
			}
			if i, ok := byInode[ino]; ok && out[i].pid == 0 {
				out[i].pid = pid
				comm, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
				out[i].comm = strings.TrimSpace(string(comm))
			}
		}
	}
	return out, nil
}

// parseProcUDP reads the sockets bound to port from a /proc/net/udp or
// udp6 table (local_address is hex: the address in the kernel's byte
// order, 32-bit words in host order, then the port).
func parseProcUDP(path string, port int) ([]udpHolder, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []udpHolder
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 {
			continue
		}
		host, portHex, ok := strings.Cut(fs[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		addr, err := procAddr(host)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		ino, err := strconv.ParseUint(fs[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: inode %q: %v", path, fs[9], err)
		}
		out = append(out, udpHolder{addr: addr, inode: ino})
	}
	return out, sc.Err()
}

// procAddr decodes an address of /proc/net/udp{,6}: 8 or 32 hex digits,
// each 32-bit word in little-endian order (x86, arm64: the kernel prints
// the words as host-order integers).
func procAddr(h string) (netip.Addr, error) {
	if len(h) != 8 && len(h) != 32 {
		return netip.Addr{}, fmt.Errorf("address %q: want 8 or 32 hex digits", h)
	}
	b := make([]byte, len(h)/2)
	for i := range b {
		v, err := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("address %q: %v", h, err)
		}
		b[i] = byte(v)
	}
	for w := 0; w < len(b); w += 4 {
		b[w], b[w+1], b[w+2], b[w+3] = b[w+3], b[w+2], b[w+1], b[w]
	}
	a, _ := netip.AddrFromSlice(b)
	return a.Unmap(), nil
}

// checkRoCEPort looks at who holds UDP 4791: on an RDMA uplink's address
// (or the wildcard), only the agent may.
func checkRoCEPort(ag *doctorAgent, addrs []uplinkAddr) doctorCheck {
	c := doctorCheck{Name: "port-4791"}
	hs, err := udpHolders(roceUDPPort)
	if err != nil {
		c.Status, c.Detail = checkWarn, fmt.Sprintf("cannot read the UDP sockets: %v", err)
		return c
	}
	agentPID := 0
	if ag != nil {
		agentPID = ag.pid
	}
	var fails, warns, oks []string
	claimed := map[int]bool{} // holders an uplink accounts for
	for _, u := range addrs {
		if !u.rdma {
			continue
		}
		held := false
		for i, h := range hs {
			if h.addr != u.ip && !h.addr.IsUnspecified() {
				continue
			}
			held = true
			claimed[i] = true
			if agentPID != 0 && h.pid == agentPID {
				oks = append(oks, fmt.Sprintf("%s: held by vrdmad (pid %d)", u.what, h.pid))
			} else {
				fails = append(fails, fmt.Sprintf("%s: UDP %d on %s is held by %s, not by vrdmad", u.what, roceUDPPort, h.addr, h.who()))
			}
		}
		if !held {
			if u.agentHolds {
				fails = append(fails, fmt.Sprintf("%s: the agent reports an engine there, but no socket holds UDP %d on %s", u.what, roceUDPPort, u.ip))
			} else {
				oks = append(oks, fmt.Sprintf("%s: UDP %d free", u.what, roceUDPPort))
			}
		}
	}
	for i, h := range hs {
		if claimed[i] {
			continue
		}
		if agentPID != 0 && h.pid == agentPID {
			oks = append(oks, fmt.Sprintf("%s: held by vrdmad (pid %d)", h.addr, h.pid))
			continue
		}
		warns = append(warns, fmt.Sprintf("UDP %d on %s is held by %s, not by vrdmad: an RDMA uplink there would not start", roceUDPPort, h.addr, h.who()))
	}
	sort.Strings(warns)
	switch {
	case len(fails) > 0:
		c.Status, c.Detail = checkFail, strings.Join(append(fails, append(oks, warns...)...), "; ")
		c.Fix = fmt.Sprintf("stop the process that holds UDP %d on the uplink's address (ss -ulpn 'sport = :%d' shows it), or give the uplink another address", roceUDPPort, roceUDPPort)
	case len(warns) > 0:
		c.Status, c.Detail = checkWarn, strings.Join(append(oks, warns...), "; ")
		c.Fix = fmt.Sprintf("if an RDMA uplink is to use that address, stop that process (ss -ulpn 'sport = :%d' shows it)", roceUDPPort)
	case len(oks) > 0:
		c.Status, c.Detail = checkPass, strings.Join(oks, "; ")
	default:
		c.Status, c.Detail = checkPass, fmt.Sprintf("UDP %d is free on every address", roceUDPPort)
	}
	return c
}

// checkClock checks that the monotonic clocks advance and asks the kernel
// whether the system clock is synchronized.
func checkClock() doctorCheck {
	c := doctorCheck{Name: "clock"}
	var m0, m1, b0, b1 unix.Timespec
	if err := errors.Join(unix.ClockGettime(unix.CLOCK_MONOTONIC, &m0), unix.ClockGettime(unix.CLOCK_BOOTTIME, &b0)); err != nil {
		c.Status, c.Detail = checkFail, fmt.Sprintf("clock_gettime: %v", err)
		c.Fix = "the kernel refuses CLOCK_MONOTONIC or CLOCK_BOOTTIME: a seccomp filter or a very old kernel; vrdmad's timers need them"
		return c
	}
	time.Sleep(20 * time.Millisecond)
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1)
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &b1)
	dm, db := time.Duration(m1.Nano()-m0.Nano()), time.Duration(b1.Nano()-b0.Nano())
	if dm < 10*time.Millisecond || db < 10*time.Millisecond {
		c.Status = checkFail
		c.Detail = fmt.Sprintf("over a 20 ms sleep CLOCK_MONOTONIC advanced %v and CLOCK_BOOTTIME %v", dm, db)
		c.Fix = "the monotonic clocks do not advance: check the kernel's clocksource (/sys/devices/system/clocksource)"
		return c
	}
	mono := fmt.Sprintf("CLOCK_MONOTONIC and CLOCK_BOOTTIME advance (%v and %v over a 20 ms sleep)", dm.Round(time.Millisecond), db.Round(time.Millisecond))
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	switch {
	case err != nil:
		c.Status, c.Detail = checkWarn, mono+fmt.Sprintf("; the kernel's NTP state is unknown (adjtimex: %v)", err)
	case state == unix.TIME_ERROR || tx.Status&unix.STA_UNSYNC != 0:
		c.Status = checkWarn
		c.Detail = mono + fmt.Sprintf("; the kernel says the system clock is not synchronized (adjtimex state %d, max error %d µs)", state, tx.Maxerror)
		c.Fix = "run an NTP client (chrony, systemd-timesyncd): host lease ages and record times compare clocks of different hosts"
	default:
		c.Status = checkPass
		c.Detail = mono + fmt.Sprintf("; the system clock is synchronized (estimated error %d µs, max %d µs)", tx.Esterror, tx.Maxerror)
	}
	return c
}
