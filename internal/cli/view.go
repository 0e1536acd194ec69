// SPDX-License-Identifier: Apache-2.0

package cli

// The device view: what a workload of vrdmactl exec finds outside the
// libraries. Middleware looks for a kernel device before it asks
// libibverbs anything: UCX lists an ibv_device only if
// /dev/infiniband/<dev_name> is a character device it may open read-write,
// and reads /sys/class/infiniband/DEV/ports/1/gid_attrs/{types,ndevs}/N as
// plain files to choose a RoCE GID; rdma-core's tests list
// /sys/class/infiniband/DEV/device/net. vrdma has no kernel device, so exec
// runs the program in a mount namespace of its own where
//
//	/dev                              a tmpfs holding the host's /dev, entry by
//	                                  entry (bind mounts; symlinks copied), and
//	/dev/infiniband/uverbsN           /dev/null bound there: a character
//	                                  device anyone may open read-write
//	/sys/class                        a tmpfs holding the host's classes (bind
//	                                  mounts), and
//	/sys/class/infiniband/vrdmaN/...  node_type, node_guid, sys_image_guid,
//	                                  node_desc, hca_type, board_id,
//	                                  ports/1/{link_layer, gids/0,
//	                                  gid_attrs/types/0, gid_attrs/ndevs/0},
//	                                  device/net/vrdmaN/address
//	/sys/class/infiniband_verbs/...   abi_version, uverbsN/{ibdev, abi_version}
//
// Nothing else changes: every other file of /dev and /sys/class is the
// host's own (the same mounts), so /dev/shm, /dev/pts and /sys/class/net
// work as before. As root the namespace is a mount namespace; for other
// users a user namespace too (their own uid and gid mapped to themselves,
// CAP_SYS_ADMIN only in it, for the helper that mounts, and dropped before
// the program starts), where the kernel allows one.
//
// The view is built by vrdmactl itself, re-executed inside the new
// namespaces as "vrdmactl __exec-view SPEC PROGRAM ARGS..." (viewMain),
// which then execs the program.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/vmnet"
)

// viewHelperArg is the first argument of vrdmactl re-executed inside the
// program's namespaces to build the view and exec the program.
const viewHelperArg = "__exec-view"

// viewSpec is what the helper is told: the VM and its adapters.
type viewSpec struct {
	VM       string        `json:"vm"`
	Adapters []viewAdapter `json:"adapters"`
	// Netns is the VM's network namespace (in /run/netns), which the
	// helper enters before it builds the view (exec --netns); "" for none.
	Netns string `json:"netns,omitempty"`
}

// viewAdapter is one adapter of the view; MAC and GID may be empty
// (unknown before the VM is attached, when the control plane assigns the
// address).
type viewAdapter struct {
	Name  string `json:"name"`  // vrdmaN
	Index int    `json:"index"` // N: its device is uverbsN
	MAC   string `json:"mac,omitempty"`
	GID   string `json:"gid,omitempty"` // sysfs form, eight groups of four hex digits
}

var (
	adapterName = regexp.MustCompile(`^vrdma[0-9]{1,2}$`)
	// vmNetnsName is a VM namespace's name as package vmnet makes it.
	vmNetnsName = regexp.MustCompile(`^` + vmnet.NamespacePrefix + `[0-9a-f]{8}-[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)
	sysfsGID    = regexp.MustCompile(`^([0-9a-f]{4}:){7}[0-9a-f]{4}$`)
)

// check validates a spec the helper was handed (it names files).
func (s viewSpec) check() error {
	if len(s.Adapters) == 0 {
		return errors.New("no adapter")
	}
	if s.Netns != "" && !vmNetnsName.MatchString(s.Netns) {
		return fmt.Errorf("network namespace %q is not a VM's (%sHOST-VM)", s.Netns, vmnet.NamespacePrefix)
	}
	for _, ad := range s.Adapters {
		if !adapterName.MatchString(ad.Name) || ad.Name != "vrdma"+strconv.Itoa(ad.Index) {
			return fmt.Errorf("adapter %q (index %d) is not vrdmaN", ad.Name, ad.Index)
		}
		if ad.MAC != "" {
			if _, err := parseMAC(ad.MAC); err != nil {
				return err
			}
		}
		if ad.GID != "" && !sysfsGID.MatchString(ad.GID) {
			return fmt.Errorf("GID %q is not in sysfs form", ad.GID)
		}
	}
	return nil
}

// viewSpecOf returns the spec of VM vm's adapters as the view shows them.
func viewSpecOf(vm string, ads []sysfsAdapter) viewSpec {
	s := viewSpec{VM: vm}
	for _, ad := range ads {
		v := viewAdapter{Name: ad.name, Index: ad.index, MAC: ad.mac}
		switch { // the agent's GID; before the VM is attached, the VMX's address's
		case ad.gid != abi.GID{}:
			v.GID = gidText(ad.gid)
		case ad.ip4.Is4():
			v.GID = gidText(ad.ip4.As16())
		case ad.ip6.Is6():
			v.GID = gidText(ad.ip6.As16())
		}
		s.Adapters = append(s.Adapters, v)
	}
	return s
}

// viewCommand returns the helper's argv for spec and the program: argv[0]
// is this executable.
func viewCommand(spec viewSpec, prog string, args []string) (string, []string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("exec: finding vrdmactl's own executable to build the device view: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return "", nil, err
	}
	return self, append([]string{self, viewHelperArg, string(b), prog}, args...), nil
}

// viewAttr returns the namespaces the helper starts in: a mount namespace
// as root; for another user a user namespace too, that user's uid and gid
// mapped to themselves and CAP_SYS_ADMIN ambient (for the helper's
// mounts; it clears that before it execs the program). extra adds
// namespaces (exec --sysfs: a network namespace, root only).
func viewAttr(extra uintptr) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | extra}
	if uid := os.Getuid(); uid != 0 || os.Geteuid() != 0 {
		gid := os.Getgid()
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
		attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
	}
	return attr
}

// noViewHint says what a program run without the view finds and does not.
const noViewHint = "it runs without the device view: no /dev/infiniband/uverbsN and no /sys/class/infiniband/vrdmaN, so UCX (ucx_info, ucx_perftest, Open MPI's pml ucx) and other programs that look there find no device; programs that only call libibverbs and librdmacm (ibv_*, perftest, rping) work as before"

// viewMain is the helper: args are the spec (JSON), the program and its
// arguments. It builds the view in the namespaces it was started in and
// execs the program; if the view cannot be built (a kernel or security
// module that refuses a mount), it says why on stderr and execs the program
// without it. It returns only if the program cannot be executed.
func viewMain(args []string, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprintf(stderr, "vrdmactl %s: want SPEC PROGRAM [ARG...] (vrdmactl exec runs this; it is not a command)\n", viewHelperArg)
		return exitUsage
	}
	var spec viewSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		fmt.Fprintf(stderr, "vrdmactl: exec: the device view's spec: %v\n", err)
		return exitFailure
	}
	if err := spec.check(); err != nil {
		fmt.Fprintf(stderr, "vrdmactl: exec: the device view's spec: %v\n", err)
		return exitFailure
	}
	// Capabilities are per thread: the thread that clears the ambient set
	// is the one that execs.
	runtime.LockOSThread()
	if spec.Netns != "" {
		if err := enterNetns(spec.Netns); err != nil {
			fmt.Fprintf(stderr, "vrdmactl: exec: %v\n", err)
			return exitFailure
		}
	}
	if err := buildView(spec); err != nil {
		if os.Getenv(viewRequiredEnv) != "" {
			fmt.Fprintf(stderr, "vrdmactl: exec: the device view: %v\n", err)
			return exitFailure
		}
		fmt.Fprintf(stderr, "vrdmactl: exec: the device view: %v: %s\n", err, noViewHint)
	}
	// The helper's CAP_SYS_ADMIN (a user's, in its own user namespace)
	// is not the program's.
	if os.Getuid() != 0 {
		if err := dropInheritable(); err != nil {
			fmt.Fprintf(stderr, "vrdmactl: exec: dropping the view helper's capabilities: %v\n", err)
			return exitFailure
		}
	}
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, viewRequiredEnv+"=") {
			env = append(env, kv)
		}
	}
	err := unix.Exec(args[1], args[1:], env)
	fmt.Fprintf(stderr, "vrdmactl: exec: %s: %v\n", args[1], err)
	return 127
}

// enterNetns moves this thread (the one that execs the program) into
// named network namespace ns, and mounts a sysfs of that namespace on /sys
// (in the helper's own mount namespace) so that /sys/class/net lists its
// interfaces, as ip netns exec does.
func enterNetns(ns string) error {
	p := filepath.Join(sys.NetnsDir, ns)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the VM's network namespace %s: %w (did the VM detach?)", p, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering the VM's network namespace %s: %w", p, err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private to the program's namespace: %w", err)
	}
	// EBUSY: /sys is this namespace's sysfs already (exec run from a
	// program in the same VM namespace).
	if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mounting the VM namespace's sysfs on /sys: %w", err)
	}
	return nil
}

// dropInheritable clears this thread's ambient and inheritable
// capabilities, so that the program execed from it has none.
func dropInheritable() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing the ambient set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clearing the inheritable set: %w", err)
	}
	return nil
}

// viewRequiredEnv, set in the helper's environment, makes a view that
// cannot be built fatal (exec --sysfs, which was asked for it).
const viewRequiredEnv = "VRDMA_EXEC_VIEW_REQUIRED"

// buildView mounts the view of spec; on failure nothing of it is left
// mounted.
func buildView(spec viewSpec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private to the program's namespace: %w", err)
	}
	if err := rebuildDir("/dev", []string{"infiniband"}, func(dir, old string) error {
		return addDevices(dir, old, spec)
	}); err != nil {
		return err
	}
	if err := rebuildDir("/sys/class", []string{"infiniband", "infiniband_verbs"}, func(dir, _ string) error {
		return addSysfs(dir, spec)
	}); err != nil {
		unix.Unmount("/dev", unix.MNT_DETACH)
		return err
	}
	return nil
}

// rebuildDir mounts a tmpfs over dir holding what dir held — each entry
// but those in skip bound there from the directory underneath (reached
// through a descriptor opened before the tmpfs hid it), symlinks copied —
// and then what add makes in it (old is the path of the hidden
// directory). On failure it unmounts the tmpfs again.
func rebuildDir(dir string, skip []string, add func(dir, old string) error) (err error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	defer unix.Close(fd)
	old := fmt.Sprintf("/proc/self/fd/%d", fd)
	entries, err := os.ReadDir(old)
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	if err := unix.Mount("vrdma-view", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a tmpfs on %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	}()
	for _, e := range entries {
		name := e.Name()
		if slices.Contains(skip, name) {
			continue
		}
		src, dst := filepath.Join(old, name), filepath.Join(dir, name)
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return fmt.Errorf("reading the link %s/%s: %w", dir, name, err)
			}
			if err := os.Symlink(target, dst); err != nil {
				return fmt.Errorf("copying the link %s/%s: %w", dir, name, err)
			}
			continue
		case e.IsDir():
			err = os.Mkdir(dst, 0o755)
		default:
			err = touch(dst, 0o644)
		}
		if err != nil {
			return fmt.Errorf("making %s: %w", dst, err)
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding the host's %s/%s there: %w", dir, name, err)
		}
	}
	return add(dir, old)
}

// addDevices makes dir/infiniband/uverbsN for each adapter: the host's
// /dev/null (old/null) bound there, a character device that anyone may
// open read-write and that does nothing.
func addDevices(dir, old string, spec viewSpec) error {
	ib := filepath.Join(dir, "infiniband")
	if err := os.Mkdir(ib, 0o755); err != nil {
		return fmt.Errorf("making %s: %w", ib, err)
	}
	for _, ad := range spec.Adapters {
		dev := filepath.Join(ib, "uverbs"+strconv.Itoa(ad.Index))
		if err := touch(dev, 0o666); err != nil {
			return fmt.Errorf("making %s: %w", dev, err)
		}
		if err := unix.Mount(filepath.Join(old, "null"), dev, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/null at %s: %w", dev, err)
		}
	}
	return nil
}

// addSysfs writes the adapters' files into dir (the view's /sys/class),
// in the form the kernel's RDMA core gives them.
func addSysfs(dir string, spec viewSpec) error {
	files := map[string]string{"infiniband_verbs/abi_version": "6"}
	sysImage := ""
	if mac := spec.Adapters[0].MAC; mac != "" {
		sysImage = guidOfMAC(mac)
	}
	for _, ad := range spec.Adapters {
		d := "infiniband/" + ad.Name + "/"
		// rdma-core's tests list device/net for the interface's name.
		if err := os.MkdirAll(filepath.Join(dir, d, "device", "net", ad.Name), 0o755); err != nil {
			return fmt.Errorf("making %s's device/net: %w", ad.Name, err)
		}
		files[d+"node_type"] = "1: CA"
		files[d+"node_desc"] = spec.VM + " " + ad.Name
		files[d+"hca_type"] = "vrdma"
		files[d+"board_id"] = "VRDMA_PVRDMA"
		files[d+"ports/1/link_layer"] = "Ethernet"
		files[d+"ports/1/gid_attrs/types/0"] = "RoCE v2"
		files[d+"ports/1/gid_attrs/ndevs/0"] = ad.Name
		if ad.MAC != "" {
			files[d+"node_guid"] = guidOfMAC(ad.MAC)
			files[d+"device/net/"+ad.Name+"/address"] = ad.MAC
		}
		if sysImage != "" {
			files[d+"sys_image_guid"] = sysImage
		}
		if ad.GID != "" {
			files[d+"ports/1/gids/0"] = ad.GID
		}
		v := "infiniband_verbs/uverbs" + strconv.Itoa(ad.Index) + "/"
		files[v+"ibdev"] = ad.Name
		files[v+"abi_version"] = "1"
	}
	for name, v := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("making %s: %w", filepath.Dir(p), err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o444); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	return nil
}

// touch creates an empty file for a bind mount to cover.
func touch(path string, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	return f.Close()
}
