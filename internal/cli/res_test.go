// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestRes creates known objects in a VM (two PDs, an MR of 8 KiB, two
// CQs, a QP) and checks what vrdmactl res reports for this process: the
// counts, the bytes, the QP with its pid; and the text view.
func TestRes(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	v := env.Open(t, "r1", testenv.VMOptions{})
	env.Open(t, "r2", testenv.VMOptions{}) // attached, no objects
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ad := v.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ad.AllocPD(ctx); err != nil {
		t.Fatal(err)
	}
	buf, err := v.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(ctx, buf, vrdma.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	cq, err := ad.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ad.CreateCQ(ctx, 16); err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}

	var rep resReport
	runJSON(t, &rep, "--socket", env.Socket, "res", "r1", "--qp", "-o", "json")
	pid := int32(os.Getpid())
	want := resRow{VM: "r1", ProcessResources: vrdma.ProcessResources{PID: pid, Adapter: ad.Name(), PDs: 2, MRs: 1, MRBytes: 8192, CQs: 2, QPs: 1}}
	if len(rep.Resources) != 1 || rep.Resources[0] != want {
		t.Errorf("res r1: %+v, want [%+v]", rep.Resources, want)
	}
	if len(rep.QPs) != 1 || rep.QPs[0].QPN != q.QPN() || rep.QPs[0].PID != pid || rep.QPs[0].State != "RESET" {
		t.Errorf("res r1 --qp: %+v, want QP 0x%x of pid %d in RESET", rep.QPs, q.QPN(), pid)
	}
	var all resReport
	runJSON(t, &all, "--socket", env.Socket, "res", "-o", "json")
	if len(all.Resources) != 2 || all.QPs != nil {
		t.Errorf("res: %+v, want r1's and r2's rows, no QPs without --qp", all)
	}
	out := runOK(t, "--socket", env.Socket, "res", "r1")
	if !strings.Contains(out, "VM  PID") || !strings.Contains(out, "r1") || !strings.Contains(out, "8192") {
		t.Errorf("res r1 (text):\n%s", out)
	}
	if _, errs, code := run(t, "", "--socket", env.Socket, "res", "nosuch"); code != exitFailure || !strings.Contains(errs, `no VM "nosuch"`) {
		t.Errorf("res nosuch: exit %d, %s", code, errs)
	}
}
