// SPDX-License-Identifier: Apache-2.0

package mgmt_test

import (
	"reflect"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
)

// TestDecodeRequests: every management command's body, registered by the
// package, decodes through abi.DecodeRequest to what was encoded, and a
// bad one fails naming its field.
func TestDecodeRequests(t *testing.T) {
	for op, body := range map[abi.Op]any{
		abi.OpDefineVM:   &mgmt.DefineVM{Name: "vm1", VMX: "memSize = \"4\"\nethernet0.virtualDev = \"vrdma\"\n"},
		abi.OpUndefineVM: &mgmt.VMRef{Name: "vm1"},
		abi.OpCreateVM: &mgmt.CreateVM{Name: "web", VMX: "memSize = \"4\"\n", Owner: &mgmt.Owner{UID: 1000, GID: 1000}, Host: "esx1",
			Placement: mgmt.Placement{Datacenter: "dc1", Folder: "prod/web", ResourcePool: "gold"}},
		abi.OpGetVM: &mgmt.VMRef{Name: "web"},
		abi.OpEditVM: &mgmt.EditVM{Name: "web", AddAdapters: []mgmt.NewAdapter{{PortGroup: "dvportgroup-10"}}, RemoveAdapters: []int{1},
			Set: []mgmt.KeyValue{{Key: "vrdma.asyncMode", Value: "TRUE"}}, Unset: []string{"sched.cpu.latencySensitivity"}},
		abi.OpPowerOnVM:  &mgmt.PowerOnVM{Name: "web", Host: "esx1"},
		abi.OpPowerOffVM: &mgmt.VMRef{Name: "web"},
	} {
		msg, err := abi.AppendMessage(nil, abi.Header{Version: abi.Version, Op: op, Seq: 1}, body)
		if err != nil {
			t.Fatal(err)
		}
		_, got, err := abi.DecodeRequest(msg)
		if err != nil || !reflect.DeepEqual(got, body) {
			t.Errorf("%s: decoded %#v, %v; want %#v", op, got, err, body)
		}
	}
	msg, _ := abi.AppendMessage(nil, abi.Header{Version: abi.Version, Op: abi.OpDefineVM, Seq: 1}, &mgmt.DefineVM{Name: "bad name"})
	if _, _, err := abi.DecodeRequest(msg); err == nil {
		t.Error("a DefineVM with a bad name decoded")
	}
}

// TestRegisterTwice: a second registration of an op is a programming
// error.
func TestRegisterTwice(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering define-vm again did not panic")
		}
	}()
	abi.RegisterRequest(abi.OpDefineVM, func() any { return new(mgmt.DefineVM) })
}
