// SPDX-License-Identifier: Apache-2.0

package cli

// How vrdmactl reaches the control plane (docs/control-plane.md). The commands
// switch, portgroup, host, path, "vm show" and "vm list --cluster" read
// and write etcd directly, not through the agent:
//
//   - with --etcd-endpoints (and --etcd-cert/--etcd-key/--etcd-ca for TLS)
//     they talk to that cluster: the same flags every vrdmad of the
//     cluster was started with. A plaintext TCP endpoint is refused (rule
//     etcd-tls) unless --insecure-etcd accepts it, as vrdmad does;
//   - without it they find the local agent's embedded etcd: the agent
//     writes its client URL to STATE-DIR/etcd/client-url
//     (store.EndpointFile), and that URL is a Unix socket only STATE-DIR's
//     owner can reach. --state-dir defaults to the agent's default state
//     directory (/var/lib/vrdma as root, ~/.local/state/vrdma otherwise).
//
// Nothing here starts an etcd: a CLI that found none says so and how to
// point it at one.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/locations"
)

// controlFlags are vrdmactl's flags that say where etcd is.
type controlFlags struct {
	endpoints []string
	cert, key string
	ca        string
	insecure  bool // --insecure-etcd
	stateDir  string
}

func (a *app) addControlFlags(root *cobra.Command) {
	c, pf := &a.ctl, root.PersistentFlags()
	pf.StringSliceVar(&c.endpoints, "etcd-endpoints", nil, "etcd endpoints of the control plane (default: the local agent's embedded etcd, found under --state-dir)")
	pf.StringVar(&c.cert, "etcd-cert", "", "client certificate for etcd (PEM)")
	pf.StringVar(&c.key, "etcd-key", "", "client key for etcd (PEM)")
	pf.StringVar(&c.ca, "etcd-ca", "", "CA that signed etcd's certificates (PEM)")
	pf.BoolVar(&c.insecure, "insecure-etcd", false, "accept --etcd-endpoints reached over plaintext TCP (http://, or host:port without the TLS flags): anyone on that network can read and write the control plane")
	pf.StringVar(&c.stateDir, "state-dir", locations.StateDir(), "the local agent's state directory, where its embedded etcd writes its address (env VRDMA_STATE_DIR)")
}

// controlEndpoints returns the etcd endpoints to use, and where they come
// from.
func (a *app) controlEndpoints() ([]string, error) {
	if len(a.ctl.endpoints) > 0 {
		return a.ctl.endpoints, nil
	}
	dir := filepath.Join(a.ctl.stateDir, "etcd")
	url, err := store.ReadEndpointFile(dir)
	if err != nil {
		return nil, fmt.Errorf("no control plane: no --etcd-endpoints, and no local agent's embedded etcd under %s (%v): pass --state-dir of an agent that runs the control plane, or --etcd-endpoints of the cluster (an agent started with --no-control-plane has none)", dir, err)
	}
	return []string{url}, nil
}

// openStore connects to the control plane.
func (a *app) openStore(ctx context.Context) (*store.Store, error) {
	eps, err := a.controlEndpoints()
	if err != nil {
		return nil, err
	}
	if (a.ctl.cert == "") != (a.ctl.key == "") {
		return nil, usageErrorf("--etcd-cert and --etcd-key go together")
	}
	tls := store.TLSFiles{CertFile: a.ctl.cert, KeyFile: a.ctl.key, CAFile: a.ctl.ca}
	if err := store.CheckPlaintext(eps, tls, "--etcd-cert/--etcd-key/--etcd-ca", "--insecure-etcd"); err != nil {
		if !a.ctl.insecure {
			return nil, &exitError{code: exitUsage, err: err}
		}
		fmt.Fprintf(a.stderr, "vrdmactl: warning: %s\n", strings.Replace(err.Error(), "; give", " (accepted by --insecure-etcd); you could give", 1))
	}
	st, err := store.Open(ctx, store.Config{Endpoints: eps, TLS: tls, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("control plane at %s: %w", strings.Join(eps, ","), err)
	}
	return st, nil
}

// withCache runs fn with a cache of the whole inventory, listed once.
func (a *app) withCache(ctx context.Context, fn func(st *store.Store, c *member.Cache) error) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, c, err := a.openCache(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	defer c.Close()
	return fn(st, c)
}

// openCache connects to the control plane and returns a cache of its
// inventory, once it has listed it (before ctx is done); the cache
// follows the control plane until it is closed, then the store.
func (a *app) openCache(ctx context.Context) (*store.Store, *member.Cache, error) {
	st, err := a.openStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	c := member.NewCache(st, member.CacheConfig{LookupTimeout: 5 * time.Second, OnBadRecord: func(e *store.RecordError) {
		fmt.Fprintf(a.stderr, "vrdmactl: skipping %v\n", e)
	}})
	select {
	case <-c.Synced():
		return st, c, nil
	case <-ctx.Done():
		c.Close()
		st.Close()
		if err := c.Err(); err != nil {
			return nil, nil, fmt.Errorf("read the control plane: %w", err)
		}
		return nil, nil, fmt.Errorf("read the control plane at %s: %w", strings.Join(st.Endpoints(), ","), ctx.Err())
	}
}

// updateRecord changes the record under key (admin.Update) and makes
// its errors the command's.
func updateRecord[T records.Record](a *app, cmd *cobra.Command, key, what, list string, edit func(*T) error) (T, error) {
	ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
	defer cancel()
	st, err := a.openStore(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	defer st.Close()
	v, err := admin.Update(ctx, st, key, what, list, edit)
	return v, cmdErr(strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" "), adminErr(err))
}

// cmdErr returns err prefixed with what, or err itself when it is nil or
// carries its own exit code (an *exitError says all it has to).
func cmdErr(what string, err error) error {
	var ee *exitError
	if err == nil || errors.As(err, &ee) {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// notFound makes a store.ErrNotFound say what was looked up.
func notFound(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%s: not found in the control plane", what)
	}
	return err
}

// ifChanged returns v when flag name was given, nil otherwise: a field of
// an admin change, which changes only what is not nil.
func ifChanged[T any](fl *pflag.FlagSet, name string, v *T) *T {
	if fl.Changed(name) {
		return v
	}
	return nil
}

// adminErr gives a change the control plane's administration refused
// as wrong as given the usage exit code.
func adminErr(err error) error {
	var ie *admin.InvalidError
	if errors.As(err, &ie) {
		return &exitError{code: exitUsage, err: err}
	}
	return err
}

// orDash returns s, or "-" if it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
