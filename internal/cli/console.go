// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/console"
	"github.com/vrdma/vrdma/internal/control/member"
)

// defaultConsoleAddr is where vrdmactl console listens by default.
const defaultConsoleAddr = "127.0.0.1:8479"

// consoleTokenEnv may hold --token's default, so that the token need not
// show in the process list.
const consoleTokenEnv = "VRDMA_CONSOLE_TOKEN"

func (a *app) consoleCommand() *cobra.Command {
	var listen, token string
	cmd := &cobra.Command{
		Use:   "console [--listen ADDR] [--token TOKEN]",
		Short: "Serve the web console: the inventory, Edit Settings, power on and off, live paths and throughput",
		Long: `console serves a web console on --listen (default ` + defaultConsoleAddr + `) and prints its
address. It shows the control plane's inventory (switches, port groups, hosts,
VMs) and runs the VM procedures (add a PVRDMA adapter, reserve all guest
memory, advanced parameters, power on and off) through the agent at --socket,
with the rule checks shown before saving, and a live view of the agent's QPs,
their paths and throughput. Its pages are embedded in vrdmactl and make no
request elsewhere.

Every write goes to the agent as vrdmactl's do, as you: whoever reaches the
console acts with your rights. So it listens only on loopback unless given
--token (or ` + consoleTokenEnv + `): then open the printed address, which carries
the token once and leaves it in a cookie. Without a control plane it shows
the local agent's VMs only.`,
		Example: `  vrdmactl console                       # http://127.0.0.1:8479/
  vrdmactl console --listen 127.0.0.1:9000
  VRDMA_CONSOLE_TOKEN=$(openssl rand -hex 16) vrdmactl console --listen 0.0.0.0:8479
  vrdmactl console --etcd-endpoints https://etcd1:2379 --etcd-ca ca.pem --etcd-cert me.pem --etcd-key me-key.pem`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := console.CheckListen(listen, token); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			ctx := cmd.Context()
			cfg := console.Config{Socket: a.socket, Token: token, CallTimeout: callTimeout}
			cache, closeCache, err := a.consoleCache(ctx)
			if err != nil {
				cfg.ControlErr = err.Error()
				fmt.Fprintf(a.stderr, "vrdmactl: console without a control plane (the local agent's VMs only): %v\n", err)
			} else {
				defer closeCache()
				cfg.Cache = cache
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("console: listen on %s: %w (another program may hold the port: --listen 127.0.0.1:PORT picks another)", listen, err)
			}
			srv := &http.Server{Handler: console.New(cfg), ReadHeaderTimeout: 10 * time.Second}
			u := "http://" + ln.Addr().String() + "/"
			if token != "" {
				u += "?token=" + url.QueryEscape(token)
			}
			fmt.Fprintf(a.stdout, "vrdma console: %s\n", u)
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				srv.Shutdown(sctx)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("console: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", defaultConsoleAddr, "address to serve on, HOST:PORT; not loopback only with --token")
	f.StringVar(&token, "token", os.Getenv(consoleTokenEnv), "a secret every request must carry (required off loopback; env "+consoleTokenEnv+")")
	return cmd
}

// consoleCache opens the control plane and a cache of its inventory that
// follows it for as long as the console runs; closeCache closes both.
func (a *app) consoleCache(ctx context.Context) (*member.Cache, func(), error) {
	octx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, c, err := a.openCache(octx)
	if err != nil {
		return nil, nil, err
	}
	return c, func() { c.Close(); st.Close() }, nil
}
