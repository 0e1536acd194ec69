// SPDX-License-Identifier: Apache-2.0

package vrdma

import "github.com/vrdma/vrdma/internal/abi"

// Error classes. Every error of the library that carries a code — each
// error the agent returns for a command (an *Error, whose Code names the
// class), and the library's own checks of arguments and state — matches
// exactly one of these under errors.Is, however deeply it is wrapped:
//
//	if _, err := pd.RegMR(ctx, buf, access); errors.Is(err, vrdma.ErrLimit) {
//		// deregister some regions, or raise the agent's --max-mr
//	}
//
// The error's message is the one to show: it says what failed, why and
// what to do; the classes are for programs that react to a failure, as
// errors.Is(err, fs.ErrNotExist) is for files. The errno in each comment
// is the one the drop-in libibverbs returns for the same failure
// (docs/wire-local.md §3). Errors without a class are ErrAgentGone, a
// context's error, a reply the library cannot read, and failures of the
// process's own system calls (mapping memory).
var (
	// ErrInvalid: an argument is out of range or malformed, or not
	// allowed here (EINVAL). Code "invalid-argument".
	ErrInvalid = abi.ErrInvalid
	// ErrNotFound: no object, VM, adapter or listener by that handle or
	// name, e.g. one destroyed already (ENOENT; EINVAL for a stale handle,
	// ENODEV for a VM at attach). Code "not-found".
	ErrNotFound = abi.ErrNotFound
	// ErrLimit: a resource limit is reached — the agent's per-VM limits
	// (max_pd, max_mr, max_cq, max_qp, listeners), guest memory, a full
	// queue (ENOMEM). Code "limit-exceeded".
	ErrLimit = abi.ErrLimit
	// ErrState: the object is not in a state that allows the request — an
	// illegal QP transition, a post to a QP that cannot take it (EINVAL) —
	// or is still in use: a PD that holds MRs or QPs, a CQ that QPs use
	// (EBUSY). Code "bad-state".
	ErrState = abi.ErrState
	// ErrExists: the name, service port or address is taken (EEXIST,
	// EADDRINUSE). Code "already-exists".
	ErrExists = abi.ErrExists
	// ErrPermission: the VM's owner rule does not allow the caller
	// (EACCES, EPERM). Code "permission-denied".
	ErrPermission = abi.ErrPermission
	// ErrUnavailable: not possible now — a peer, host or the control plane
	// cannot be reached, a connect timed out, the agent is shutting down;
	// trying again later may succeed (ETIMEDOUT, EHOSTUNREACH, EAGAIN).
	// Code "unavailable".
	ErrUnavailable = abi.ErrUnavailable
	// ErrRefused: the peer refused the connection — nothing listens on the
	// port, or the listener rejected it (ECONNREFUSED); an *Error's Reject
	// holds the IBTA reject. Code "refused".
	ErrRefused = abi.ErrRefused
	// ErrInternal: the agent failed on its own account, a system call or a
	// bug to report with the message (EIO). Code "internal".
	ErrInternal = abi.ErrInternal
)

// errorf returns an error of the library's own of class code (an abi
// code) whose message is exactly the formatted text.
func errorf(code, format string, args ...any) error {
	return abi.Errorf(code, "", format, args...)
}
