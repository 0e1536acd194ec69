// SPDX-License-Identifier: Apache-2.0

package abi

import "errors"

// The sentinel errors of the error codes, one per code. An *Error matches
// the sentinel of its Code under errors.Is (see Error.Is), as a
// syscall.Errno matches fs.ErrNotExist: callers test the class of a
// failure with errors.Is(err, ErrLimit) and still print the message, which
// says what failed and what to do. The client library exports them as
// vrdma.ErrInvalid and so on. wire-local.md §3 says what each code means
// and the errno a C library returns for it.
var (
	ErrInvalid     = errors.New("vrdma: invalid argument")  // CodeInvalid
	ErrNotFound    = errors.New("vrdma: not found")         // CodeNotFound
	ErrLimit       = errors.New("vrdma: limit exceeded")    // CodeLimit
	ErrState       = errors.New("vrdma: bad state")         // CodeState
	ErrExists      = errors.New("vrdma: already exists")    // CodeExists
	ErrPermission  = errors.New("vrdma: permission denied") // CodePermission
	ErrUnavailable = errors.New("vrdma: unavailable")       // CodeUnavailable
	ErrRefused     = errors.New("vrdma: refused")           // CodeRefused
	ErrInternal    = errors.New("vrdma: internal error")    // CodeInternal
)

// codeErrs maps each code to its sentinel.
var codeErrs = map[string]error{
	CodeInvalid:     ErrInvalid,
	CodeNotFound:    ErrNotFound,
	CodeLimit:       ErrLimit,
	CodeState:       ErrState,
	CodeExists:      ErrExists,
	CodePermission:  ErrPermission,
	CodeUnavailable: ErrUnavailable,
	CodeRefused:     ErrRefused,
	CodeInternal:    ErrInternal,
}

// CodeError returns the sentinel error of code (ErrLimit for CodeLimit),
// or nil for a code it does not know.
func CodeError(code string) error { return codeErrs[code] }

// Is reports whether target is the sentinel of e's code, so that
// errors.Is(err, ErrLimit) holds for an *Error of CodeLimit, however
// deeply err wraps it. An unknown code matches no sentinel.
func (e *Error) Is(target error) bool {
	s := codeErrs[e.Code]
	return s != nil && s == target
}
