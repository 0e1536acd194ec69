// SPDX-License-Identifier: Apache-2.0

package manage

import (
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/rules"
	"github.com/vrdma/vrdma/internal/vmx"
)

// vmRules runs every rule (package rules) against VM file f at vrdma's own
// level (rules.Default, ESXi 8.0), and the host rules against host when it
// is not nil. standalone says the VM is to run at this agent without a
// control plane (rules.Target.Standalone).
func vmRules(f *vmx.File, host *records.Host, standalone bool) []mgmt.Finding {
	t := rules.Target{ESXi: rules.Default, Standalone: standalone}
	if host != nil {
		t.Host = member.RulesHost(*host)
	}
	return abiFindings(rules.Check(f, t))
}

// abiFindings converts findings for the agent's replies.
func abiFindings(fs []rules.Finding) []mgmt.Finding {
	var out []mgmt.Finding
	for _, fd := range fs {
		out = append(out, mgmt.Finding{Rule: fd.Rule, Severity: fd.Severity, Key: fd.Key, Line: fd.Line, Message: fd.Message})
	}
	return out
}
