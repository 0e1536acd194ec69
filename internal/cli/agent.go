// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/agentcmd"
)

// agentCommand is "vrdmactl agent [vrdmad flags]": the host agent itself,
// so that quickstart and perf --local can start one on a machine where no
// vrdmad binary is installed (they re-execute vrdmactl with it). Hidden:
// people run vrdmad.
func (a *app) agentCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "agent [vrdmad flags]",
		Short:              "Run the host agent (vrdmad) in this process",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := agentcmd.Main("vrdmactl agent", args, a.stdout, a.stderr); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
}
