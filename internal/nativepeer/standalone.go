// SPDX-License-Identifier: Apache-2.0

package nativepeer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
)

// standaloneVM is the VM of a standalone peer: one adapter, memory enough
// for the largest region.
const standaloneVM = "native-peer"

const standaloneVMX = `.encoding = "UTF-8"
config.version = "8"
virtualHW.version = "20"
guestOS = "ubuntu-64"
memSize = "64"
ethernet0.present = "TRUE"
ethernet0.virtualDev = "vrdma"
`

// CMTiming is the CM response timeout (a 5-bit code: 4.096 µs × 2^n) and
// Max CM Retries of a standalone peer's REQs; zero takes rdma_cm's.
type CMTiming struct{ ResponseTimeout, MaxRetries uint8 }

// Standalone starts an agent of this process's own, in directory dir,
// without a control plane: a plain RoCEv2 peer on UDP addr:4791
// (agent.Config.NativePeer), which knows nothing of vrdma hosts, with
// RDMA CM on its QP1 (its REQs timed as cmt says); it returns a VM of it
// with one adapter, and stop, which closes both.
func Standalone(ctx context.Context, addr netip.Addr, dir string, cmt CMTiming, log *slog.Logger) (vm *vrdma.VM, stop func(), err error) {
	socket := filepath.Join(dir, "s")
	a, err := agent.New(agent.Config{Socket: socket, StateDir: filepath.Join(dir, "state"), Host: "native-peer", Logger: log, NativePeer: addr, InProcess: true,
		CMResponseTimeout: cmt.ResponseTimeout, CMMaxRetries: cmt.MaxRetries})
	if err != nil {
		return nil, nil, fmt.Errorf("start the peer's RoCEv2 engine on %s: %w", addr, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Serve(sctx); err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("native peer: the in-process agent stopped", "err", err)
		}
	}()
	stopAgent := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			log.Warn("native peer: the in-process agent did not stop within 10s")
		}
	}
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(socket))
	if err != nil {
		stopAgent()
		return nil, nil, err
	}
	err = ag.DefineVM(ctx, standaloneVM, []byte(standaloneVMX))
	ag.Close()
	if err == nil {
		vm, err = vrdma.Open(ctx, standaloneVM, vrdma.WithSocket(socket))
	}
	if err != nil {
		stopAgent()
		return nil, nil, fmt.Errorf("the peer's VM: %w", err)
	}
	return vm, func() { vm.Close(); stopAgent() }, nil
}
