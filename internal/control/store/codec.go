// SPDX-License-Identifier: Apache-2.0

package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/vrdma/vrdma/internal/control/records"
)

// Errors about what is stored under a key. Each comes wrapped in a
// *RecordError that names the key.
var (
	// ErrBadRecord is matched by every *RecordError: the value under a key
	// is not a record this build can use.
	ErrBadRecord = errors.New("bad record")
	// ErrSchema: the record has another schema version (written by a newer
	// or older build).
	ErrSchema = errors.New("unknown schema version")
	// ErrForeign: the record is of another kind than its key says, or has
	// no kind.
	ErrForeign = errors.New("foreign record")
	// ErrGarbage: the value is not a JSON record at all.
	ErrGarbage = errors.New("not a JSON record")
)

// RecordError reports a value that cannot be used as a record, with its
// key. Readers report it and skip the record; it never stops them.
type RecordError struct {
	Key string
	Err error // ErrSchema, ErrForeign or ErrGarbage wrapped, or the record's validation errors
}

// Error returns "record <key>: <cause>".
func (e *RecordError) Error() string { return fmt.Sprintf("record %s: %v", e.Key, e.Err) }

// Unwrap returns the cause.
func (e *RecordError) Unwrap() error { return e.Err }

// Is reports whether target is ErrBadRecord.
func (e *RecordError) Is(target error) bool { return target == ErrBadRecord }

// Encode validates r and returns its stored form: the record's JSON object
// with the schema version and the kind first,
//
//	{"schema":1,"kind":"switch","name":"dvs1",...}
//
// An invalid record is not encoded: the error matches records.ErrInvalid.
func Encode(r records.Record) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", r.Kind(), err)
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("encode %s: not a JSON object", r.Kind())
	}
	out := make([]byte, 0, len(body)+32)
	out = append(out, `{"schema":`...)
	out = strconv.AppendInt(out, records.Schema, 10)
	out = append(out, `,"kind":`...)
	out = strconv.AppendQuote(out, string(r.Kind()))
	if len(body) > 2 {
		out = append(out, ',')
	}
	return append(out, body[1:]...), nil
}

// header is the part of every stored record that says what it is.
type header struct {
	Schema *int   `json:"schema"`
	Kind   string `json:"kind"`
}

// Decode reads the record stored under key. Anything else than a valid
// record of T's kind and this build's schema — garbage, another schema
// version, another kind, a missing or bad field — is a *RecordError that
// names the key.
func Decode[T records.Record](key string, val []byte) (T, error) {
	var zero, v T
	var h header
	if err := json.Unmarshal(val, &h); err != nil {
		return zero, &RecordError{key, fmt.Errorf("%w: %v", ErrGarbage, err)}
	}
	switch {
	case h.Schema == nil:
		return zero, &RecordError{key, fmt.Errorf("%w: no schema version", ErrSchema)}
	case *h.Schema != records.Schema:
		return zero, &RecordError{key, fmt.Errorf("%w: schema %d, this build reads schema %d", ErrSchema, *h.Schema, records.Schema)}
	case h.Kind != string(zero.Kind()):
		return zero, &RecordError{key, fmt.Errorf("%w: kind %q where %q belongs", ErrForeign, h.Kind, zero.Kind())}
	}
	if err := json.Unmarshal(val, &v); err != nil {
		return zero, &RecordError{key, fmt.Errorf("%w: %v", ErrGarbage, err)}
	}
	if err := v.Validate(); err != nil {
		return zero, &RecordError{key, err}
	}
	return v, nil
}
