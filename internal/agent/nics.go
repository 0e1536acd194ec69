// SPDX-License-Identifier: Apache-2.0

package agent

// The uplinks' NIC state as this machine's kernel reports it (PFC, pause,
// DCB trust, MTU, teaming: package nicstate), published in the host
// record as each uplink's Observed state, which path selection and
// "vrdmactl network check" on every host read (it wins over what the
// operator declares, field by field). The agent reads it when it starts,
// before it registers, and then every ControlConfig.NICPoll: its
// pollNICs goroutine, owned by the control plane's stop channel, updates
// the record when the kernel's answer changed.

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"time"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/netcheck/nicstate"
)

// defaultNICPoll is how often the agent reads its uplinks' NIC state.
const defaultNICPoll = 30 * time.Second

// observeUplinks returns ups, each with the state the kernel reports of
// its NIC: the device it names, or else the interface that holds its
// address. An uplink the kernel says nothing of keeps no observed state.
func observeUplinks(ups []records.Uplink, log *slog.Logger) []records.Uplink {
	out := slices.Clone(ups)
	if len(out) == 0 {
		return out
	}
	k, err := nicstate.Dial(0)
	if err != nil {
		log.Warn("cannot read the uplinks' NIC state from the kernel: path selection counts what is declared", "err", err)
		return out
	}
	defer k.Close()
	for i := range out {
		u := &out[i]
		u.Observed = records.NICState{}
		dev := u.Device
		if dev == "" {
			dev = interfaceOf(u.Address)
		}
		if dev == "" {
			log.Info("uplink's address is on no interface of this host: its NIC state is not read", "uplink", u.Name())
			continue
		}
		st, err := nicstate.Read(k, dev)
		if err != nil {
			log.Warn("read uplink's NIC state", "uplink", u.Name(), "device", dev, "err", err)
			continue
		}
		u.Observed = st.NICState
	}
	return out
}

// interfaceOf is the name of the interface that holds addr, "" if none;
// a loopback address (127.0.0.0/8, ::1) is the loopback interface's.
func interfaceOf(addr netip.Addr) string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	addr = addr.Unmap()
	for _, ifc := range ifs {
		if addr.IsLoopback() && ifc.Flags&net.FlagLoopback != 0 {
			return ifc.Name
		}
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if p, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap() == addr {
					return ifc.Name
				}
			}
		}
	}
	return ""
}

// pollNICs reads the uplinks' NIC state every poll and publishes it when
// it changed, until the control plane stops.
func (c *control) pollNICs(poll time.Duration, last []records.Uplink) {
	defer c.wg.Done()
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := observeUplinks(c.cfg.Uplinks, c.log)
		if reflect.DeepEqual(now, last) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
		_, err := c.member.UpdateHost(ctx, func(h *records.Host) error {
			h.Uplinks = slices.Clone(h.Uplinks)
			for i := range h.Uplinks {
				if j := slices.IndexFunc(now, func(u records.Uplink) bool { return records.SameUplink(u, h.Uplinks[i]) }); j >= 0 {
					h.Uplinks[i].Observed = now[j].Observed
				}
			}
			return nil
		})
		cancel()
		if err != nil {
			c.log.Warn("publish the uplinks' NIC state", "err", err)
			continue
		}
		c.log.Info("uplinks' NIC state changed: published")
		last = now
	}
}
