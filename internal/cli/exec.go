// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
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
	var sysfs, netns, noView bool
	cmd := &cobra.Command{
		Use:   "exec --vm NAME [--lib DIR] -- PROGRAM [ARG...]",
		Short: "Run an unmodified RDMA program as a workload of a VM (the drop-in libibverbs and librdmacm)",
		Long: `exec runs PROGRAM, an unmodified program linked with libibverbs or librdmacm
(ibv_devinfo, ibv_rc_pingpong, perftest's ib_write_bw, rping, ...), as a workload
of VM NAME: with vrdma's drop-in libibverbs.so.1 and librdmacm.so.1 first on
LD_LIBRARY_PATH, VRDMA_VM=NAME and VRDMA_SOCKET set to this command's --socket,
so that the VM's adapters are the program's devices (vrdma0, ...) and their IP
addresses what rdma_cm resolves. The program's exit status is exec's.

The libraries are --lib DIR's, else $` + libEnv + `'s, else the vrdma-dropin
package's in ` + guest.InstalledDir + ` when it was built from the same sources as
this vrdmactl, else built from the sources inside vrdmactl into the user's cache
directory on first use (that needs gcc, make, libibverbs-dev, and librdmacm-dev
for librdmacm.so.1).

The program also finds what middleware looks for outside the libraries (the
device view): /dev/infiniband/uverbsN, a character device it may open
read-write, and /sys/class/infiniband/vrdmaN (node_guid, ports/1/gids/0,
gid_attrs/types/0 and ndevs/0, device/net/vrdmaN) with
/sys/class/infiniband_verbs/uverbsN, in a mount namespace of its own; the
rest of /dev and /sys/class is the host's. UCX (ucx_info, ucx_perftest,
Open MPI's pml ucx) lists an adapter only through them. As root that is a
mount namespace; for another user a user namespace too, where the kernel
gives one: where it does not, exec says so and runs the program without the
view (libibverbs and librdmacm programs work without it; UCX finds no device).
--no-view runs the program without it.

With --netns (root), the program runs in the VM's network namespace on this
host, one per VM shared by its programs, which vrdmad --vm-netns makes when
the VM attaches: interface vrdmaN carries adapter N's MAC and address (the
VMX's, or the one the control plane assigned, which exec waits for: it
attaches the VM before the program starts), on the adapter's port group's
layer 2, so TCP, UDP and ICMP reach the VM's port group's other VMs, on this
host and on others, by the same addresses rdma_cm resolves
(docs/network.md). --sysfs is --netns where the agent makes VM namespaces;
where it does not, --sysfs gives the program a network namespace of its own
with the interfaces and addresses but no layer 2 (its TCP reaches only
itself), as rdma-core's tests need. docs/verbs-compat.md says what works.`,
		Example: `  vrdmactl exec --vm vm1 -- ibv_devinfo -v
  vrdmactl exec --vm vm1 -- ibv_rc_pingpong -g 0 -c &
  vrdmactl exec --vm vm2 -- ibv_rc_pingpong -g 0 -c localhost
  vrdmactl exec --vm vm1 -- rping -s -a 10.0.0.1 -v -C 10 &
  vrdmactl exec --vm vm2 -- rping -c -a 10.0.0.1 -v -C 10
  vrdmactl exec --netns --vm vm1 -- iperf3 -s &
  vrdmactl exec --netns --vm vm2 -- iperf3 -c 10.0.0.1`,
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
			plain := exec.Command(prog, args[1:]...)
			c, viewed := plain, false
			namespaced := sysfs || netns
			switch {
			case namespaced:
				var release func()
				if c, release, err = a.netnsView(cmd.Context(), vmName, prog, args[1:], sysfs && !netns); err != nil {
					return err
				}
				defer release()
				viewed = true
			case !noView:
				if v := a.viewCmd(cmd.Context(), vmName, prog, args[1:]); v != nil {
					c, viewed = v, true
				}
			}
			a.prepareWorkload(c, dir, vmName)
			if namespaced {
				c.Env = append(c.Env, viewRequiredEnv+"=1")
			}
			// The program gets the terminal's signals itself (same process
			// group); exec only waits for it.
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
			defer signal.Stop(sig)
			err = c.Start()
			if err != nil && viewed && !namespaced {
				// The kernel refused the namespaces (a user's, mostly).
				fmt.Fprintf(a.stderr, "vrdmactl: exec: no namespace for the device view (%v)%s: %s\n", err, userNSHint(), noViewHint)
				c = plain
				a.prepareWorkload(c, dir, vmName)
				err = c.Start()
			}
			if err != nil {
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
	cmd.Flags().BoolVar(&noView, "no-view", false, "run the program in this mount namespace, without the device view (/dev/infiniband/uverbsN, /sys/class/infiniband/vrdmaN) that UCX and Open MPI need")
	cmd.Flags().BoolVar(&netns, "netns", false, "as root: run the program in the VM's network namespace (vrdmad --vm-netns), where interface vrdmaN carries adapter N's address on its port group's layer 2, with the device view")
	cmd.Flags().BoolVar(&sysfs, "sysfs", false, "as root: --netns where the agent makes VM namespaces; else a network namespace of the program's own with an interface per adapter carrying its address (rdma-core's tests look there), with the device view")
	cmd.Flags().StringVar(&lib, "lib", "", "directory holding the drop-in libibverbs.so.1 (default: $"+libEnv+", else "+guest.InstalledDir+" if it is this build's, else built on first use)")
	return cmd
}

// prepareWorkload sets what every program exec runs gets: the drop-in's
// environment, exec's standard files, and death with exec.
func (a *app) prepareWorkload(c *exec.Cmd, dir, vm string) {
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	// The program is exec's workload: killed with exec, it ends too
	// (the agent then releases what it held).
	c.SysProcAttr.Pdeathsig = syscall.SIGTERM
	c.Env = execEnv(os.Environ(), dir, a.socket, vm)
	c.Stdin, c.Stdout, c.Stderr = a.stdin, a.stdout, a.stderr
}

// viewCmd returns the command that runs prog through the device view of
// VM vm's adapters (view.go); nil, having said why, when the agent cannot
// say what they are.
func (a *app) viewCmd(ctx context.Context, vm, prog string, args []string) *exec.Cmd {
	ads, err := a.vmAdapters(ctx, vm)
	if err != nil {
		fmt.Fprintf(a.stderr, "vrdmactl: exec: no device view: %v: %s\n", err, noViewHint)
		return nil
	}
	self, argv, err := viewCommand(viewSpecOf(vm, ads), prog, args)
	if err != nil {
		fmt.Fprintf(a.stderr, "vrdmactl: %v: %s\n", err, noViewHint)
		return nil
	}
	c := exec.Command(self)
	c.Args = argv
	c.SysProcAttr = viewAttr(0)
	return c
}

// userNSHint says, to a user other than root, what decides whether the
// kernel gives them a user namespace.
func userNSHint() string {
	if os.Geteuid() == 0 {
		return ""
	}
	return fmt.Sprintf("; this kernel refuses uid %d a user namespace (the sysctls user.max_user_namespaces and kernel.unprivileged_userns_clone, a security module such as Ubuntu's kernel.apparmor_restrict_unprivileged_userns, or a user namespace of exec's own that does not map its uid, decide); run exec as root, or allow user namespaces, for the view", os.Geteuid())
}

// libDir returns the directory of the drop-in libibverbs.so.1: flag's,
// $VRDMA_LIBIBVERBS's, the installed one of this build, or one built from
// the embedded sources under the user's cache directory.
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
	return guest.FindIBVerbs(guest.InstalledDir, filepath.Join(cache, "vrdma"))
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
