// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/console"
)

// defaultConsoleAddr is where vrdmactl console listens by default.
const defaultConsoleAddr = "127.0.0.1:8479"

// consoleTokenEnv may hold --token's default, so that the token need not
// show in the process list.
const consoleTokenEnv = "VRDMA_CONSOLE_TOKEN"

func (a *app) consoleCommand() *cobra.Command {
	var listen, token, certFile, keyFile, clientCA string
	var agents []string
	cmd := &cobra.Command{
		Use:   "console [--listen ADDR] [--token TOKEN] [--tls-cert F --tls-key F [--tls-client-ca F]] [--agent SOCKET]...",
		Short: "Serve the web console: the inventory, Edit Settings, power on and off, live paths and throughput",
		Long: `console serves a web console on --listen (default ` + defaultConsoleAddr + `) and prints its
address. It shows the control plane's inventory (switches, port groups, hosts,
VMs) and runs the VM procedures (add a PVRDMA adapter, reserve all guest
memory, advanced parameters, power on and off) through the agent at --socket,
with the rule checks shown before saving, and a live view of the agent's QPs,
their paths and throughput. Its pages are embedded in vrdmactl and make no
request elsewhere.

It also configures hosts for PVRDMA (tagged address, pvrdma firewall rule,
PVRDMA namespaces), creates and deletes switches, port groups and VMs, and
draws a map of the hosts with the paths their QPs take and the traffic on
them. The live view and the map read the local agent and every --agent: the
sockets of other hosts' agents, on this machine or forwarded from theirs
(ssh -L /tmp/esx2.sock:/run/vrdma/agent.sock esx2).

Every write goes to the agent or the control plane as vrdmactl's do, as you:
whoever reaches the console acts with your rights. So it listens only on
loopback unless given --token (or ` + consoleTokenEnv + `): then open the printed
address, which carries the token once and leaves it in a cookie; or served
over TLS (--tls-cert, --tls-key) with client certificates signed by
--tls-client-ca required of every connection. Without a control plane it
shows the local agent's VMs only.`,
		Example: `  vrdmactl console                       # http://127.0.0.1:8479/
  vrdmactl console --listen 127.0.0.1:9000
  VRDMA_CONSOLE_TOKEN=$(openssl rand -hex 16) vrdmactl console --listen 0.0.0.0:8479
  vrdmactl console --listen 0.0.0.0:8479 --tls-cert console.pem --tls-key console-key.pem --tls-client-ca operators-ca.pem
  vrdmactl console --agent /tmp/esx2.sock --agent /tmp/esx3.sock
  vrdmactl console --etcd-endpoints https://etcd1:2379 --etcd-ca ca.pem --etcd-cert me.pem --etcd-key me-key.pem`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (certFile == "") != (keyFile == "") || (clientCA != "" && certFile == "") {
				return usageErrorf("console: --tls-cert and --tls-key go together, and --tls-client-ca needs them")
			}
			if err := console.CheckListen(listen, token, clientCA != ""); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			var tlsCfg *tls.Config
			if certFile != "" {
				var err error
				if tlsCfg, err = console.TLSConfig(certFile, keyFile, clientCA); err != nil {
					return &exitError{code: exitUsage, err: err}
				}
			}
			ctx := cmd.Context()
			cfg := console.Config{Socket: a.socket, Agents: agents, Token: token, ClientCerts: clientCA != "", CallTimeout: callTimeout}
			octx, cancel := context.WithTimeout(ctx, callTimeout)
			st, cache, err := a.openCache(octx)
			cancel()
			if err != nil {
				cfg.ControlErr = err.Error()
				fmt.Fprintf(a.stderr, "vrdmactl: console without a control plane (the local agent's VMs only): %v\n", err)
			} else {
				defer st.Close()
				defer cache.Close()
				cfg.Store, cfg.Cache = st, cache
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("console: listen on %s: %w (another program may hold the port: --listen 127.0.0.1:PORT picks another)", listen, err)
			}
			u := console.URL(ln.Addr(), tlsCfg != nil, token)
			fmt.Fprintf(a.stdout, "vrdma console: %s\n", u)
			return console.Serve(ctx, ln, console.New(cfg), tlsCfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", defaultConsoleAddr, "address to serve on, HOST:PORT; not loopback only with --token")
	f.StringVar(&token, "token", os.Getenv(consoleTokenEnv), "a secret every request must carry (off loopback, this or --tls-client-ca; env "+consoleTokenEnv+")")
	f.StringVar(&certFile, "tls-cert", "", "serve HTTPS with this certificate (PEM)")
	f.StringVar(&keyFile, "tls-key", "", "the private key of --tls-cert (PEM)")
	f.StringVar(&clientCA, "tls-client-ca", "", "require of every connection a client certificate signed by a CA of this file (PEM)")
	f.StringArrayVar(&agents, "agent", nil, "the Unix socket of another host's agent the live view and map read too (repeatable)")
	return cmd
}
