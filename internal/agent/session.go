// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/manage"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// session is one client connection: a workload attached to a VM, or a
// management client (vrdmactl) that never attaches.
type session struct {
	a    *Agent
	log  *slog.Logger // the agent's, with the session's ID and peer pid on every line
	conn *sys.PacketConn
	pid  int32
	uid  uint32
	gid  uint32
	// cred says pid, uid and gid come from SO_PEERCRED; without it the
	// session is nobody's and may attach or change no VM (manage.go).
	cred bool
	// refused is why the session may not be served (its uid has too
	// many, quota.Sessions): the first command is answered with it, and
	// the session ends. Nil when the session holds its charge.
	refused error

	ctx      context.Context // ends with the connection; cancels blocking ops
	cancel   context.CancelFunc
	wg       sync.WaitGroup // blocking ops
	blocking chan struct{}  // one token per blocking op in flight

	sendMu sync.Mutex
	out    []byte // +checklocks:sendMu

	vm *device.Context // set by attach; read by the serve goroutine and blocking ops after it
	// reqFD is the descriptor the command being served carried (open-xrcd's
	// file), -1 for none; the serve goroutine's.
	reqFD int
	cm    *cm.Client // the session's listeners

	cmEv  *cm.Events  // rdma_cm's event channels and cm-listens
	async asyncEvents // the event sockets of ibv_get_async_event (events.go)

	// clientCaps are the features the client said it knows in its hello
	// (0 without one). No behaviour depends on them yet: a feature that a
	// client could notice is started only for clients that set its bit.
	// Written by the serve goroutine.
	clientCaps abi.Caps
}

func newSession(a *Agent, c *sys.PacketConn) *session {
	s := &session{a: a, conn: c, blocking: make(chan struct{}, a.cfg.MaxBlocking)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.cm = a.cm.NewClient(s.ctx)
	if cred, err := c.PeerCred(); err == nil {
		s.pid, s.uid, s.gid, s.cred = cred.Pid, cred.Uid, cred.Gid, true
	}
	s.log = a.log.With("session", sessionIDs.Add(1), "pid", s.pid)
	s.cmEv = cm.NewEvents(s.cm, a.cmreg, cmHosts{a}, s.log)
	if !s.cred {
		s.log.Warn("SO_PEERCRED failed: the session may attach or change no VM")
	}
	if err := a.quota.Take(s.uid, quota.Sessions, 1); err != nil {
		s.refused = err
		s.log.Warn("session refused", "uid", s.uid, "err", err)
	}
	return s
}

// sessionIDs numbers the agent's sessions, for their log lines.
var sessionIDs atomic.Uint64

// serve reads commands until the connection ends, then cleans up.
func (s *session) serve() {
	defer s.end()
	s.reqFD = -1
	defer s.dropReqFD()
	buf := make([]byte, abi.MaxMessage)
	if s.refused != nil {
		// Tell the client why with the answer to its first command.
		if n, fds, err := s.conn.Recv(buf); err == nil {
			for _, fd := range fds {
				sys.CloseFD(fd)
			}
			h, _, _ := abi.DecodeRequest(buf[:n])
			var e *abi.Error
			errors.As(s.refused, &e)
			s.replyErr(h, e)
		}
		return
	}
	for {
		s.dropReqFD() // the previous command's, answered
		n, fds, err := s.conn.Recv(buf)
		for i, fd := range fds {
			// Clients send a descriptor with open-xrcd only (its
			// file), served on this goroutine; any other goes at once.
			if i == 0 && err == nil && n >= abi.CmdHeaderSize && abi.PeekOp(buf[:n]) == abi.OpOpenXRCD {
				s.reqFD = fd
				continue
			}
			sys.CloseFD(fd)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("session read", "err", err)
			}
			return
		}
		h, req, err := abi.DecodeRequest(buf[:n])
		if err != nil {
			if h.Op == 0 || h.Version != abi.Version {
				s.log.Warn("closing session: undecodable message", "err", err)
				s.replyErr(h, decodeError(h, err))
				return
			}
			s.replyErr(h, decodeError(h, err))
			continue
		}
		in, _ := h.Op.Info() // a decoded request's op is in the table
		if in.Attach && s.vm == nil {
			s.replyErr(h, errNotAttached)
			continue
		}
		if in.Blocking {
			// Blocking commands run in their own goroutine. They need an
			// attached VM (the table marks every blocking op Attach);
			// checking that above, before the goroutine starts, means
			// s.vm is never written while one runs. Their number is
			// bounded so that a client cannot pile up goroutines.
			select {
			case s.blocking <- struct{}{}:
			default:
				s.replyErr(h, abi.Errorf(abi.CodeLimit, "", "%d blocking commands (%s) already in flight on this session, the limit (vrdmad --max-blocking-per-session): wait for some to finish", s.a.cfg.MaxBlocking, blockingOps))
				continue
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() { <-s.blocking }()
				s.dispatch(h, req)
			}()
			continue
		}
		s.dispatch(h, req)
	}
}

// dropReqFD closes the descriptor the last command carried, if any.
func (s *session) dropReqFD() {
	if s.reqFD >= 0 {
		sys.CloseFD(s.reqFD)
		s.reqFD = -1
	}
}

// decodeError turns a DecodeRequest error into the error reply, keeping
// the field at fault.
func decodeError(h abi.Header, err error) *abi.Error {
	var e *abi.Error
	if !errors.As(err, &e) {
		return abi.Errorf(abi.CodeInvalid, "", "%v", err)
	}
	msg := e.Message
	if h.Op.Known() {
		msg = h.Op.String() + ": " + msg
	}
	return &abi.Error{Code: e.Code, Field: e.Field, Message: msg}
}

// DefaultMaxBlocking is the default of Config.MaxBlocking.
const DefaultMaxBlocking = 256

// end tears the session down. The connection closes last, after the
// VM detached: a client's Close waits for that end of file (conn.go), so
// what it does next finds the VM gone. No reply matters any more, so
// sends fail at once rather than block on a client that stopped reading.
func (s *session) end() {
	s.cancel()
	s.conn.SetWriteDeadline(time.Unix(1, 0))
	s.cm.Close()
	s.wg.Wait()
	s.cmEv.Close()
	s.closeAsync() // events.go
	if s.vm != nil {
		s.a.detachVM(s.vm)
	}
	s.conn.Close()
	if s.refused == nil {
		s.a.quota.Give(s.uid, quota.Sessions, 1)
	}
}

// PID, Close and Closed make s a device.Owner.

// PID is the session's peer process (SO_PEERCRED).
func (s *session) PID() int32 { return s.pid }

// UID is the session's peer user (SO_PEERCRED); a session without
// credentials may attach nothing, so it is never asked.
func (s *session) UID() uint32 { return s.uid }

// Close closes the session's connection: serve then ends the session.
func (s *session) Close() { s.conn.Close() }

// Closed reports whether the session has ended or is ending.
func (s *session) Closed() bool { return s.ctx.Err() != nil }

func (s *session) reply(h abi.Header, body any, fds ...int) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	var err error
	s.out, err = abi.AppendMessage(s.out[:0], abi.Header{Version: abi.Version, Flags: abi.FlagResponse, Op: h.Op, Seq: h.Seq}, body)
	if err != nil {
		s.log.Error("encode reply", "op", h.Op, "seq", h.Seq, "err", err)
		return
	}
	if err := s.conn.Send(s.out, fds...); err != nil {
		s.log.Debug("send reply", "op", h.Op, "seq", h.Seq, "err", err)
	}
}

func (s *session) replyErr(h abi.Header, e *abi.Error) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	var err error
	s.out, err = abi.AppendMessage(s.out[:0], abi.Header{Version: abi.Version, Flags: abi.FlagResponse | abi.FlagError, Op: h.Op, Seq: h.Seq}, e)
	if err == nil {
		s.conn.Send(s.out)
	}
}

// dispatch runs one command and answers it. A panic in a handler is a bug:
// it is logged and answered as an internal error, and the agent goes on
// serving.
func (s *session) dispatch(h abi.Header, req any) {
	defer func() {
		if r := recover(); r != nil {
			buf := make([]byte, 8192)
			buf = buf[:runtime.Stack(buf, false)]
			s.log.Error("command handler failed", "op", h.Op, "seq", h.Seq, "panic", r, "stack", string(buf))
			s.replyErr(h, abi.Errorf(abi.CodeInternal, "", "internal error in %s: %v (a bug: please report it)", h.Op, r))
		}
	}()
	hd, ok := handlers[h.Op]
	if !ok {
		s.replyErr(h, abi.Errorf(abi.CodeInvalid, "op", "op %s is not served", h.Op))
		return
	}
	body, fds, err := hd.fn(s, s.vm, req)
	if err != nil {
		var e *abi.Error
		if !errors.As(err, &e) {
			e = abi.Errorf(abi.CodeInternal, "", "%v", err)
		}
		s.replyErr(h, e)
		return
	}
	if g, ok := body.(givenAway); ok {
		// The descriptors are the workload's now: the agent's copies go.
		s.reply(h, g.body, g.fds...)
		for _, fd := range g.fds {
			sys.CloseFD(fd)
		}
		return
	}
	s.reply(h, body, fds...)
}

// givenAway is a reply body whose descriptors the agent keeps no use for
// once sent (the workload's end of an event socket): dispatch closes them
// after the reply. The descriptors of the other replies stay the objects'
// (a ring, a doorbell's other end, guest memory).
type givenAway struct {
	body any
	fds  []int
}

var errNotAttached = abi.Errorf(abi.CodeState, "", "attach a VM first: this command works on an attached VM's objects")

func (s *session) hello(_ *device.Context, hello *abi.Hello) (any, []int, error) {
	a := s.a
	s.clientCaps = hello.Caps
	s.log.Debug("hello", "client", hello.Client, "caps", hello.Caps)
	return abi.HelloReply{Host: a.cfg.Host, HostID: a.hostID, AgentVersion: Version, Caps: a.caps()}, nil, nil
}

func (s *session) attach(_ *device.Context, r *abi.Attach) (any, []int, error) {
	a := s.a
	if s.vm != nil {
		return nil, nil, abi.Errorf(abi.CodeState, "vm", "this session is already attached to VM %q", s.vm.Name())
	}
	v, err := a.attachVM(s, r.VM)
	if err != nil {
		return nil, nil, err
	}
	s.vm = v
	v.SetDirectCapable(s.clientCaps.Has(abi.CapDirect)) // memcpy-direct only between sessions that know it (direct.go)
	v.SetDirectSendCapable(s.clientCaps.Has(abi.CapDirect | abi.CapDirectSend))
	rep, memFD := v.AttachReply(a.cfg.Host)
	s.log.Info("VM attached", "vm", v.Name(), "mem_mib", v.Config().MemSizeMB, "locked", rep.MemLocked, "async", rep.AsyncMode, "adapters", len(rep.Adapters))
	return rep, []int{memFD}, nil
}

func (s *session) acceptRequest(v *device.Context, ar *abi.AcceptRequest) (any, []int, error) {
	r, err := s.cmEv.Accept(v, ar) // for a cm-listen's request, its ESTABLISHED too
	return r, nil, err
}

// blockingOps names the ops the table marks Blocking, for the error of
// one too many.
var blockingOps = func() string {
	var names []string
	for _, in := range abi.Ops() {
		if in.Blocking {
			names = append(names, in.Name)
		}
	}
	return strings.Join(names, ", ")
}()

// caps returns the capability bits the agent serves (abi.Caps): every
// feature it has, and the tcp path only when it runs one (a control plane
// and a PVRDMA address).
func (a *Agent) caps() abi.Caps {
	c := abi.CapAsyncMode | abi.CapFence | abi.CapPathMemcpy | abi.CapCM | abi.CapQPCounters | abi.CapVMManage | abi.CapMRIOVA | abi.CapAsyncEvents | abi.CapSRQ | abi.CapUD |
		abi.CapUC | abi.CapCoreVerbs | abi.CapQPEvents | abi.CapMW | abi.CapXRC | abi.CapMcast | abi.CapODP | abi.CapAtomicWrite | abi.CapCQOverrun | abi.CapOpenQP | abi.CapDirect | abi.CapDirectSend
	if a.up != nil {
		c |= abi.CapPathTCP
	}
	return c
}

func (a *Agent) status() mgmt.Status {
	st := mgmt.Status{Host: a.cfg.Host, HostID: a.hostID, DatagramsDropped: a.dev.UDDropped()}
	seen := map[string]bool{}
	for _, vs := range a.dev.VMStatuses() {
		vs.Power = string(records.PoweredOn)
		vs.Netns = a.vmNamespace(vs.Name)
		st.VMs = append(st.VMs, vs)
		seen[vs.Name] = true
	}
	files, _ := filepath.Glob(filepath.Join(a.cfg.StateDir, "vms", "*.vmx"))
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".vmx")
		if seen[name] {
			continue
		}
		vs := mgmt.VMStatus{Name: name, Power: a.proc.LocalPower(name)}
		if cfg, err := a.loadVMConfig(name); err == nil {
			vs.AsyncMode, vs.MemSize, vs.MemReserved = cfg.AsyncMode, uint64(cfg.MemSizeMB)<<20, cfg.MemoryLocked()
			for _, c := range cfg.Adapters {
				vs.Adapters = append(vs.Adapters, abi.AdapterInfo{Name: c.Name(), Index: c.Index})
			}
		}
		st.VMs = append(st.VMs, vs)
		seen[name] = true
	}
	st.VMs = append(st.VMs, a.proc.ManagedHere(seen)...)
	sort.Slice(st.VMs, func(i, j int) bool { return st.VMs[i].Name < st.VMs[j].Name })
	if a.up != nil {
		st.PVRDMA = a.up.PVRDMAStatus()
		st.Uplinks = a.up.Status()
	}
	for _, e := range []*rdma.Engine{a.rdma, a.rdma1} {
		if e != nil {
			st.RDMA = append(st.RDMA, e.Status())
		}
	}
	if a.gsi != nil && len(st.RDMA) > 0 {
		a.cmStatus(&st.RDMA[0]) // a.rdma's (native.go)
	}
	if a.local != nil {
		a.local.Status(&st)
	}
	st.PathDecisions, st.Connects = a.decisions.status(), a.cm.Connects()
	return st
}

// statusFor is the status report as caller may see it: another user's
// VMs without their objects (processes, registered memory, QPs with their
// numbers and peers, counters), which only root, the agent's user and the
// VM's owner see (docs/SECURITY.md, "Addresses, keys and QP numbers").
func (a *Agent) statusFor(caller *manage.Caller) mgmt.Status {
	st := a.status()
	for i := range st.VMs {
		vs := &st.VMs[i]
		if a.proc.MaySee(caller, vs.Name) {
			continue
		}
		vs.Processes, vs.MemRegistered, vs.QPs, vs.AdapterCounters, vs.Resources = nil, 0, nil, nil, nil
		vs.ObjectsHidden = true
	}
	return st
}

// caller is s as the VM procedures see it.
func (s *session) caller() *manage.Caller {
	return &manage.Caller{Cred: s.cred, UID: s.uid, GID: s.gid, PID: s.pid, Ctx: s.ctx}
}

// connect dials c.Remote with a QP of the session's VM: a listener of
// this host through connection management, or one on another host over
// the tcp path.
func (s *session) connect(c *abi.Connect) (abi.ConnectReply, error) {
	q, err := s.vm.QPByHandle(c.QP)
	if err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", c.QP)
	}
	if err := cm.CheckDialer(q, false, false); err != nil {
		return abi.ConnectReply{}, err
	}
	rep, err := s.dial(q, c)
	s.a.cm.CountDial(err)
	return rep, err
}

// dial dials c.Remote with q, checked to dial.
func (s *session) dial(q *device.QP, c *abi.Connect) (abi.ConnectReply, error) {
	ad, end, err := s.a.resolveConnect(q.Adapter(), c.Remote) // control.go
	if err != nil {
		return abi.ConnectReply{}, err
	}
	if end != nil {
		return s.a.dialRemote(s.ctx, q, c, end, cm.Dial{})
	}
	return s.cm.Connect(q, ad, c)
}
