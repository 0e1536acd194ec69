// SPDX-License-Identifier: Apache-2.0

package device

// The polling loop of an async-mode VM (RoutineAsyncPoller,
// asyncPoller.run), one per VM, owned by the VM: attachVM starts it,
// teardown stops it after every QP is destroyed.
//
//	qp.runSQ:  after its work, polls its own queues briefly (asyncSpins),
//	           then publishes the tails at which it has nothing to do,
//	           hands itself to the poller (watch) and parks on its channel
//	           (idle.ch) with the doorbell flag clear: the workload does not
//	           ring.
//	run:       looks at the tails of every watched QP, round after round;
//	           a QP whose tail moved leaves the set and is signalled on its
//	           channel, and the loop yields its P (runtime.Gosched) so that
//	           the QP's goroutine runs on this thread at once, without an OS
//	           thread wake-up. After asyncSpins empty rounds it yields the CPU
//	           (sched_yield) between rounds; after asyncYields more it
//	           releases every watched QP (idle.released) and parks until a
//	           QP hands itself in again.
//	qp.runSQ, released: sets its doorbell flag, looks at its tails once more
//	           (the Dekker pair with the workload's tail store and flag
//	           load) and sleeps on its doorbell, as in doorbell mode.
//
// So 256 idle async QPs cost one goroutine's polling, bounded in time, and
// nothing at all once the budget is spent, instead of 256 spinners that
// starve each other and the workloads on a small machine.

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
)

// asyncPoller watches the queues of a VM's idle async QPs.
type asyncPoller struct {
	mu      sync.Mutex
	watched []*QP // +checklocks:mu
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// asyncIdle is what a QP published when it handed itself to the poller.
type asyncIdle struct {
	ch       chan struct{} // the poller's signal: work, or released
	released atomic.Bool   // the poller gave the QP back to its doorbell
	polled   atomic.Bool   // in the poller's set; written under asyncPoller.mu
	sqTail   atomic.Uint32 // the SQ tail it had caught up with
	rqTail   atomic.Uint32 // the RQ tail, when watchRQ (ERR, RESET: posts flush)
	rq       atomic.Bool
}

func newAsyncPoller() *asyncPoller {
	p := &asyncPoller{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

// watch adds q, which has published its idle tails, to the set. When it
// returns, q is watched: a QP still in the set (woken by a state change)
// stays, and the poller reads its new tails.
func (p *asyncPoller) watch(q *QP) {
	p.mu.Lock()
	if !q.idle.polled.Load() {
		q.idle.polled.Store(true)
		p.watched = append(p.watched, q)
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// forget removes q from the set: its rings are about to be unmapped.
func (p *asyncPoller) forget(q *QP) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, o := range p.watched {
		if o == q {
			p.watched = append(p.watched[:i], p.watched[i+1:]...)
			q.idle.polled.Store(false)
			return
		}
	}
}

// close stops the loop and waits for it.
func (p *asyncPoller) close() {
	close(p.stop)
	<-p.done
}

func (p *asyncPoller) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		for empty := 0; ; {
			n, found := p.round(false)
			if n == 0 {
				break
			}
			if found {
				empty = 0
				runtime.Gosched() // the QPs signalled run on this thread now
				continue
			}
			empty++
			if empty < asyncSpins {
				continue
			}
			if empty >= asyncSpins+asyncYields {
				p.round(true)
				break
			}
			YieldCPU()
			if empty&1023 == 0 {
				select {
				case <-p.stop:
					return
				default:
				}
			}
		}
	}
}

// round looks at every watched QP once, signalling and removing those
// with work; with release it releases every QP. It returns how many QPs
// it looked at and whether one had work.
func (p *asyncPoller) round(release bool) (n int, found bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = len(p.watched)
	keep := p.watched[:0]
	for _, q := range p.watched {
		moved := q.idle.moved(q.ring.Bytes())
		if !moved && !release {
			keep = append(keep, q)
			continue
		}
		found = found || moved
		q.idle.polled.Store(false)
		if !moved {
			q.idle.released.Store(true)
		}
		select {
		case q.idle.ch <- struct{}{}:
		default:
		}
	}
	clear(p.watched[len(keep):])
	p.watched = keep
	return n, found
}

// moved reports whether the workload posted since the QP went idle.
func (a *asyncIdle) moved(mem []byte) bool {
	if abi.Word(mem, abi.OffSQTail).Load() != a.sqTail.Load() {
		return true
	}
	return a.rq.Load() && abi.Word(mem, abi.OffRQTail).Load() != a.rqTail.Load()
}
