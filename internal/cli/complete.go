// SPDX-License-Identifier: Apache-2.0

package cli

// Shell completion of object names: VMs, hosts, switches, port groups
// and adapters, read from the agent and the control plane when the shell
// asks (cobra's __complete). A source that does not answer within
// completeTimeout offers nothing, without an error: completion must not
// hang a shell.

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/store"
)

// completeTimeout bounds what one completion reads.
const completeTimeout = 2 * time.Second

// names lists the names of one kind of object, those starting with
// prefix.
type names func(a *app, ctx context.Context, prefix string) []string

// fromCache lists names read from the control plane's inventory.
func fromCache(list func(c *member.Cache) []string) names {
	return func(a *app, ctx context.Context, _ string) []string {
		var out []string
		a.withCache(ctx, func(_ *store.Store, c *member.Cache) error {
			out = list(c)
			return nil
		})
		return out
	}
}

var (
	switchNames = fromCache(func(c *member.Cache) (out []string) {
		for _, s := range c.Switches() {
			out = append(out, s.Name)
		}
		return out
	})
	portGroupKeys = fromCache(func(c *member.Cache) (out []string) {
		for _, p := range c.PortGroups() {
			out = append(out, p.Key)
		}
		return out
	})
	hostNames = fromCache(func(c *member.Cache) (out []string) {
		for _, h := range c.Hosts() {
			out = append(out, h.Host.Name)
		}
		return out
	})
)

// localStatus is the local agent's status report, nil if no agent
// answers.
func (a *app) localStatus(ctx context.Context) *vrdma.Status {
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(a.socket))
	if err != nil {
		return nil
	}
	defer ag.Close()
	st, err := ag.Status(ctx)
	if err != nil {
		return nil
	}
	return &st
}

// vmNames lists the local agent's VMs and the control plane's.
func vmNames(a *app, ctx context.Context, prefix string) []string {
	var out []string
	if st := a.localStatus(ctx); st != nil {
		for _, v := range st.VMs {
			out = append(out, v.Name)
		}
	}
	if _, err := a.controlEndpoints(); err == nil {
		out = append(out, fromCache(func(c *member.Cache) (out []string) {
			for _, v := range c.VMs() {
				out = append(out, v.Name)
			}
			return out
		})(a, ctx, prefix)...)
	}
	return out
}

// vmAdapterNames lists VM/ADAPTER for the local agent's VMs, and the VMs
// alone.
func vmAdapterNames(a *app, ctx context.Context, _ string) []string {
	var out []string
	if st := a.localStatus(ctx); st != nil {
		for _, v := range st.VMs {
			out = append(out, v.Name)
			for _, ad := range v.Adapters {
				out = append(out, v.Name+"/"+ad.Name)
			}
		}
	}
	return out
}

// adapterNames lists the adapters of the VM --vm names (of every local
// VM without it).
func adapterNames(a *app, ctx context.Context, vm string) []string {
	var out []string
	if st := a.localStatus(ctx); st != nil {
		for _, v := range st.VMs {
			if vm != "" && v.Name != vm {
				continue
			}
			for _, ad := range v.Adapters {
				out = append(out, ad.Name)
			}
		}
	}
	return out
}

// complete is a cobra completion function offering list's names.
func (a *app) complete(list names) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
		defer cancel()
		return matching(list(a, ctx, toComplete), toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// matching returns the names that start with prefix, sorted, once each.
func matching(names []string, prefix string) []string {
	out := []string{}
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// argNames says what the positional arguments of a command (its path
// without "vrdmactl") name; all: every argument, not only the first.
var argNames = map[string]struct {
	list names
	all  bool
}{
	"switch show": {list: switchNames}, "switch set": {list: switchNames}, "switch delete": {list: switchNames},
	"switch router set": {list: switchNames}, "switch router remove": {list: switchNames},
	"portgroup show": {list: portGroupKeys}, "portgroup set": {list: portGroupKeys}, "portgroup delete": {list: portGroupKeys},
	"host show": {list: hostNames}, "host forget-key": {list: hostNames}, "host remove": {list: hostNames},
	"host configure": {list: hostNames}, "host uplink declare": {list: hostNames},
	"vm undefine": {list: vmNames}, "vm show": {list: vmNames}, "vm edit": {list: vmNames}, "vm set": {list: vmNames},
	"vm reserve-memory": {list: vmNames}, "vm power-on": {list: vmNames}, "vm power-off": {list: vmNames},
	"stat": {list: vmAdapterNames}, "res": {list: vmNames}, "path explain": {list: vmAdapterNames, all: true},
}

// flagNames says what a flag's value names, by the flag's name.
var flagNames = map[string]names{
	"vm": vmNames, "host": hostNames, "local-host": hostNames, "switch": switchNames, "portgroup": portGroupKeys,
}

// addCompletions gives the commands under root their completions of
// object names: positional arguments by argNames, flags by flagNames,
// and the adapter flag (-d, --ib-dev) by the --vm given.
func (a *app) addCompletions(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.TrimPrefix(strings.TrimPrefix(c.CommandPath(), root.Name()), " ")
		if n, ok := argNames[path]; ok && c.ValidArgsFunction == nil {
			list, all := n.list, n.all
			c.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				if len(args) > 0 && !all {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return a.complete(list)(cmd, args, toComplete)
			}
		}
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if list, ok := flagNames[f.Name]; ok {
				c.RegisterFlagCompletionFunc(f.Name, a.complete(list))
			}
			if f.Name == "ib-dev" {
				c.RegisterFlagCompletionFunc(f.Name, func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
					ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
					defer cancel()
					vm, _ := cmd.Flags().GetString("vm")
					return matching(adapterNames(a, ctx, vm), toComplete), cobra.ShellCompDirectiveNoFileComp
				})
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
