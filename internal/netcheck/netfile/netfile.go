// SPDX-License-Identifier: Apache-2.0

// Package netfile reads a network to check from a declarative file,
// YAML or JSON, so that vrdmactl network check --config FILE can check a
// network before it exists. docs/network.md documents
// the format.
//
// The file holds the records of the control plane, with the same fields
// and their JSON names (package records): switches (with their routers and
// network policy), port groups, and hosts with their RDMA uplinks and each
// uplink's declared NIC state. What only a running system knows gets a
// default: a switch's UUID, MTU 9000 and uplink policy "single" (as
// vrdmactl switch create); a port group's name is its key; a host's ID is
// its name, it is up, and an uplink's GID is its address's. With one
// switch in the file, port groups and hosts are on it unless they say
// otherwise.
//
// Parse is strict: an unknown field, a duplicate key, a record that does
// not validate or a reference to a switch the file lacks is an error that
// says where. Every error matches ErrBadFile.
package netfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/netcheck"
)

// MaxBytes bounds a file.
const MaxBytes = 1 << 20

// Limits on what a file may hold.
const (
	MaxSwitches   = 64
	MaxPortGroups = 1024
	MaxHosts      = 1024
)

// ErrBadFile is matched (errors.Is) by every error of Parse.
var ErrBadFile = errors.New("bad network file")

// File is the top level of a network file.
type File struct {
	Switches   []records.Switch    `json:"switches"`
	PortGroups []records.PortGroup `json:"portGroups"`
	Hosts      []records.Host      `json:"hosts"`
}

// defaultUUID is the UUID of a switch that the file gives none.
const defaultUUID = "00000000-0000-0000-0000-000000000000"

// Parse reads a network file: JSON when its first non-blank byte is '{',
// YAML otherwise. On error the model is empty.
func Parse(data []byte) (netcheck.Model, error) {
	f, err := decode(data)
	if err != nil {
		return netcheck.Model{}, err
	}
	f.fill()
	if err := f.check(); err != nil {
		return netcheck.Model{}, err
	}
	return netcheck.Model{Switches: f.Switches, PortGroups: f.PortGroups, Hosts: f.Hosts}, nil
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadFile}, args...)...)
}

func decode(data []byte) (File, error) {
	var f File
	if len(data) > MaxBytes {
		return f, bad("%d bytes, more than %d", len(data), MaxBytes)
	}
	js := data
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		j, err := yaml.YAMLToJSONStrict(data)
		if err != nil {
			return f, bad("YAML: %v", err)
		}
		js = j
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return f, bad("empty: want switches, portGroups and hosts")
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return File{}, bad("%v", jsonErr(js, err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return File{}, bad("more after the top-level object")
	}
	return f, nil
}

// jsonErr says where a JSON decoding error is.
func jsonErr(js []byte, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("line %d: %v", lineOf(js, se.Offset), err)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Errorf("%s: want %s, not a JSON %s", te.Field, te.Type, te.Value)
		}
		return fmt.Errorf("the top level is a JSON %s: want an object of switches, portGroups and hosts", te.Value)
	}
	return err
}

func lineOf(b []byte, off int64) int {
	off = min(max(off, 0), int64(len(b)))
	return bytes.Count(b[:off], []byte("\n")) + 1
}

// fill sets the defaults of what only a running system knows.
func (f *File) fill() {
	one := ""
	if len(f.Switches) == 1 {
		one = f.Switches[0].Name
	}
	for i := range f.Switches {
		s := &f.Switches[i]
		if s.UUID == "" {
			s.UUID = defaultUUID
		}
		if s.MTU == 0 {
			s.MTU = 9000
		}
		if s.UplinkPolicy == "" {
			s.UplinkPolicy = records.UplinkSingle
		}
	}
	for i := range f.PortGroups {
		p := &f.PortGroups[i]
		if p.Name == "" {
			p.Name = p.Key
		}
		if p.Switch == "" {
			p.Switch = one
		}
	}
	for i := range f.Hosts {
		h := &f.Hosts[i]
		if h.ID == "" {
			h.ID = h.Name
		}
		if h.Name == "" {
			h.Name = h.ID
		}
		if h.Switch == "" {
			h.Switch = one
		}
		if h.State == "" {
			h.State = records.HostUp
		}
		if h.AgentVersion == "" {
			h.AgentVersion = "declared"
		}
		for j := range h.Uplinks {
			if u := &h.Uplinks[j]; !u.GID.IsValid() {
				u.GID = records.GIDOf(u.Address)
			}
		}
	}
}

// check validates every record and the references between them.
func (f *File) check() error {
	var errs []error
	add := func(where string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
	}
	if len(f.Switches) == 0 {
		errs = append(errs, errors.New("switches: none (a network file declares at least one switch)"))
	}
	if len(f.Switches) > MaxSwitches || len(f.PortGroups) > MaxPortGroups || len(f.Hosts) > MaxHosts {
		errs = append(errs, fmt.Errorf("%d switches, %d port groups, %d hosts: at most %d, %d and %d", len(f.Switches), len(f.PortGroups), len(f.Hosts), MaxSwitches, MaxPortGroups, MaxHosts))
		return bad("%w", errors.Join(errs...))
	}
	seen := map[string]bool{}
	once := func(where, what, v string) {
		if seen[what+"\x00"+v] {
			add(where, fmt.Errorf("%s %q is declared twice", what, v))
		}
		seen[what+"\x00"+v] = true
	}
	onSwitch := func(where, sw string) {
		if sw != "" && !seen["switch\x00"+sw] {
			add(where, fmt.Errorf("switch %q is not in the file", sw))
		}
	}
	for i, s := range f.Switches {
		where := fmt.Sprintf("switches[%d]", i)
		add(where, s.Validate())
		once(where, "switch", s.Name)
	}
	for i, p := range f.PortGroups {
		where := fmt.Sprintf("portGroups[%d]", i)
		add(where, p.Validate())
		onSwitch(where, p.Switch)
		once(where, "port group", p.Key)
	}
	for i, h := range f.Hosts {
		where := fmt.Sprintf("hosts[%d]", i)
		add(where, h.Validate())
		onSwitch(where, h.Switch)
		once(where, "host ID", h.ID)
		once(where, "host name", h.Name)
	}
	if len(errs) > 0 {
		return bad("%w", errors.Join(errs...))
	}
	return nil
}
