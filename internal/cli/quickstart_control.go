package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// The distributed switch and port group quickstart creates in its agent's
// embedded control plane; both VMs' adapters are on them, so their pair's
// path is decided by path selection (memcpy: same host).
const (
	quickstartSwitch    = "quickstart-dvs"
	quickstartPortGroup = "dvportgroup-quickstart"
)

// createQuickstartFabric creates quickstart's switch and port group in the
// embedded etcd of local agent ag (found through its state directory).
func createQuickstartFabric(ctx context.Context, ag *localAgent) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	dir := filepath.Join(ag.Dir, "state", "etcd")
	url, err := store.ReadEndpointFile(dir)
	if err != nil {
		return fmt.Errorf("the agent's control plane: %w", err)
	}
	st, err := store.Open(ctx, store.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("the agent's control plane at %s: %w", url, err)
	}
	defer st.Close()
	sw := records.Switch{Name: quickstartSwitch, UUID: randomUUID(), MTU: 9000, UplinkPolicy: records.UplinkSingle}
	if _, err := st.Create(ctx, records.SwitchKey(sw.Name), sw); err != nil {
		return fmt.Errorf("create switch %s: %w", sw.Name, err)
	}
	pg := records.PortGroup{Name: "quickstart", Key: quickstartPortGroup, Switch: sw.Name, VLAN: 0, PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}
	if _, err := st.Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		return fmt.Errorf("create port group %s: %w", pg.Key, err)
	}
	return nil
}
