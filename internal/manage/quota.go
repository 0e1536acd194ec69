// SPDX-License-Identifier: Apache-2.0

package manage

// The procedures' share of the quotas (package quota): who may pin guest
// memory, how many VMs a uid owns, and what its writes to the control
// plane cost.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// checkPin refuses VM e with configuration cfg, asked for by s, if it
// reserves and locks its guest memory and no administrator allowed that:
// its owner is not one that may pin (quota.Ledger.MayPin) and the VM was
// not written with pinning by root or the agent's user. Such a write
// (s privileged) marks e allowed.
func (mg *Procedures) checkPin(s *Caller, e *vmEntry, cfg *vmconfig.Config) error {
	if !cfg.MemoryLocked() {
		return nil
	}
	if s.privileged() {
		e.pinOK = true
		return nil
	}
	if e.pinOK || mg.quota.MayPin(e.owner.UID) {
		return nil
	}
	return quota.PinError(e.name, e.owner.UID)
}

// checkVMCount refuses uid one more VM when it owns Limits.VMsPerUser
// already: those of the state directory and the managed VMs of the
// control plane. A control plane that does not answer is left out of the
// count for a VM of the state directory (define works without etcd),
// which the caller holds mg.mu for; a managed VM is not created then.
// Root and the agent's user are not refused, nor is a VM they give.
func (mg *Procedures) checkVMCount(ctx context.Context, s *Caller, uid uint32) error {
	if mg.quota.Exempt(uid) || s.privileged() {
		return nil
	}
	n := 0
	files, _ := filepath.Glob(filepath.Join(mg.stateDir, "vms", "*.state"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var st localState
		if json.Unmarshal(b, &st) == nil && st.Owner.UID == uid {
			n++
		}
	}
	if c := mg.ctl; c != nil {
		ctx, cancel := context.WithTimeout(ctx, c.LookupTimeout)
		items, _, _, err := store.List[records.VM](ctx, c.Store, records.VMPrefix)
		cancel()
		if err == nil {
			for _, it := range items {
				if it.Value.Managed && it.Value.Owner.UID == uid {
					n++
				}
			}
		}
	}
	if max := mg.quota.Limits().VMsPerUser; n >= max {
		return quota.VMsError(uid, n, max)
	}
	return nil
}

// recordBytes is what writing r costs in the control plane: its encoded
// size (etcd keeps each revision whole until it compacts them).
func recordBytes(r *records.VM) uint64 {
	b, _ := json.Marshal(r)
	return uint64(len(b))
}
