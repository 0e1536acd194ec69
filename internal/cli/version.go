// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/buildinfo"
)

// versionReport is "vrdmactl version -o json".
type versionReport struct {
	Client buildinfo.Info `json:"client"`
	// Agent is the release of the agent at --socket; empty when none
	// answers there (AgentError says why).
	Agent      string `json:"agent,omitempty"`
	AgentHost  string `json:"agent_host,omitempty"`
	AgentError string `json:"agent_error,omitempty"`
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print vrdmactl's version and build information, and the agent's release",
		Long: `Print the version of vrdmactl and how it was built: the vrdma release, the
module version, the commit it was built from (vcs.revision, its time, and
whether the work tree was modified), the Go toolchain and the platform, as
the go command recorded them in the binary (runtime/debug.ReadBuildInfo).

Then, if an agent answers at --socket, the release it reports. vrdmad
--version prints the agent binary's own build information the same way.

A binary built with -buildvcs=false, or from a git worktree (which the go
command does not stamp), knows no commit and says "commit unknown".`,
		Example: `  vrdmactl version
  vrdmactl version -o json
  vrdmad --version`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep := versionReport{Client: buildinfo.Read("vrdmactl")}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
			defer cancel()
			if ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(a.socket)); err != nil {
				rep.AgentError = fmt.Sprintf("no agent answers at %s: %v", a.socket, err)
			} else {
				rep.Agent, rep.AgentHost = ag.Info.AgentVersion, ag.Info.Host
				ag.Close()
			}
			if a.json() {
				return a.printJSON(rep)
			}
			fmt.Fprint(a.stdout, rep.Client)
			if rep.Agent != "" {
				fmt.Fprintf(a.stdout, "agent: vrdmad %s at %s (host %s)\n", rep.Agent, a.socket, rep.AgentHost)
			} else {
				fmt.Fprintf(a.stdout, "agent: none (%s)\n", rep.AgentError)
			}
			return nil
		},
	}
}
