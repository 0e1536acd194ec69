package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/guest"
)

// libEnv is the environment variable naming a directory that holds a
// built libibverbs.so.1, for exec without --lib.
const libEnv = "VRDMA_LIBIBVERBS"

func (a *app) execCommand() *cobra.Command {
	var vmName, lib string
	var sysfs bool
	cmd := &cobra.Command{
		Use:   "exec --vm NAME [--lib DIR] -- PROGRAM [ARG...]",
		Short: "Run an unmodified RDMA program as a workload of a VM (the drop-in libibverbs and librdmacm)",
		Long: `exec runs PROGRAM, an unmodified program linked with libibverbs or librdmacm
(ibv_devinfo, ibv_rc_pingpong, perftest's ib_write_bw, rping, ...), as a workload
of VM NAME: with vrdma's drop-in libibverbs.so.1 and librdmacm.so.1 first on
LD_LIBRARY_PATH, VRDMA_VM=NAME and VRDMA_SOCKET set to this command's --socket,
so that the VM's adapters are the program's devices (vrdma0, ...) and their IP
addresses what rdma_cm resolves. The program's exit status is exec's.

The libraries are --lib DIR's, else $` + libEnv + `'s, else built from the
sources inside vrdmactl into the user's cache directory on first use (that needs
gcc, make, libibverbs-dev, and librdmacm-dev for librdmacm.so.1).

With --sysfs (root), the program also finds what programs look for outside
the libraries: /sys/class/infiniband/vrdmaN (node_guid, the first GID,
device/net/vrdmaN) on a tmpfs, and a (veth) network interface vrdmaN with the
adapter's MAC and addresses, in mount and network namespaces of its own (so
its TCP reaches only itself). docs/verbs-compat.md says what works.`,
		Example: `  vrdmactl exec --vm vm1 -- ibv_devinfo -v
  vrdmactl exec --vm vm1 -- ibv_rc_pingpong -g 0 -c &
  vrdmactl exec --vm vm2 -- ibv_rc_pingpong -g 0 -c localhost
  vrdmactl exec --vm vm1 -- rping -s -a 10.0.0.1 -v -C 10 &
  vrdmactl exec --vm vm2 -- rping -c -a 10.0.0.1 -v -C 10`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("exec: name the PROGRAM to run after --")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if vmName == "" {
				return usageErrorf("exec: --vm NAME is required: the program runs as that VM's workload")
			}
			dir, err := libDir(lib)
			if err != nil {
				return err
			}
			prog, err := exec.LookPath(args[0])
			if err != nil {
				return fmt.Errorf("exec: %w", err)
			}
			c := exec.Command(prog, args[1:]...)
			if sysfs {
				sh, shArgs, attr, err := a.sysfsView(cmd.Context(), vmName)
				if err != nil {
					return err
				}
				c = exec.Command(sh)
				c.Args = append(append(shArgs, prog), args[1:]...)
				c.SysProcAttr = attr
			}
			if c.SysProcAttr == nil {
				c.SysProcAttr = &syscall.SysProcAttr{}
			}
			// The program is exec's workload: killed with exec, it ends too
			// (the agent then releases what it held).
			c.SysProcAttr.Pdeathsig = syscall.SIGTERM
			c.Env = execEnv(os.Environ(), dir, a.socket, vmName)
			c.Stdin, c.Stdout, c.Stderr = a.stdin, a.stdout, a.stderr
			// The program gets the terminal's signals itself (same process
			// group); exec only waits for it.
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
			defer signal.Stop(sig)
			if err := c.Start(); err != nil {
				return fmt.Errorf("exec: %w", err)
			}
			go func() {
				for s := range sig {
					if c.Process != nil {
						c.Process.Signal(s)
					}
				}
			}()
			err = c.Wait()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code := ee.ExitCode()
				if code < 0 { // killed by a signal: the shell's convention
					if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
						code = 128 + int(ws.Signal())
					} else {
						code = 1
					}
				}
				return &exitError{code: code} // the program said why, if it did
			}
			return err
		},
	}
	cmd.Flags().SetInterspersed(false) // the program's flags are its own
	cmd.Flags().StringVar(&vmName, "vm", "", "the VM whose workload the program is")
	cmd.Flags().BoolVar(&sysfs, "sysfs", false, "as root: run the program with /sys/class/infiniband/vrdmaN and a network interface per adapter carrying its address (rdma-core's tests look there), in mount and network namespaces of its own")
	cmd.Flags().StringVar(&lib, "lib", "", "directory holding the drop-in libibverbs.so.1 (default: $"+libEnv+", else built on first use)")
	return cmd
}

// libDir returns the directory of the drop-in libibverbs.so.1: flag's,
// $VRDMA_LIBIBVERBS's, or one built from the embedded sources under the
// user's cache directory.
func libDir(flag string) (string, error) {
	for _, d := range []string{flag, os.Getenv(libEnv)} {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "libibverbs.so.1")); err != nil {
			return "", fmt.Errorf("exec: no libibverbs.so.1 in %s (make -C guest/ibverbs OUT=%s builds it)", d, d)
		}
		return filepath.Abs(d)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return guest.BuildIBVerbs(filepath.Join(cache, "vrdma"))
}

// execEnv returns env with the drop-in first on LD_LIBRARY_PATH and the
// workload's VM and agent socket set.
func execEnv(env []string, dir, socket, vm string) []string {
	out := make([]string, 0, len(env)+3)
	ld := dir
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "LD_LIBRARY_PATH":
			if v != "" {
				ld = dir + ":" + v
			}
			continue
		case "VRDMA_VM", "VRDMA_SOCKET":
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LD_LIBRARY_PATH="+ld, "VRDMA_VM="+vm, "VRDMA_SOCKET="+socket)
}
