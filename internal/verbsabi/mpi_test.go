// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// mpiBuild compiles testdata/mpi/NAME.c with mpicc into dir.
func mpiBuild(t *testing.T, dir, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	if b, err := exec.Command("mpicc", "-Wall", "-Wextra", "-O2", "-o", out, filepath.Join("testdata", "mpi", name+".c")).CombinedOutput(); err != nil || len(b) > 0 {
		t.Fatalf("mpicc %s.c: %v\n%s", name, err, b)
	}
	return out
}

// mpirunArgs returns the arguments of Open MPI's mpirun that run prog
// with args as rank 0 in VM vmA (at e.sockA) and rank 1 in vmB (at
// e.sockB), each through vrdmactl exec (the MPMD form: one app context
// per rank, each with its own -x), with pml ucx on transports tls.
// Open MPI takes pml ucx only on the transports and devices its
// pml_ucx_tls and pml_ucx_devices name ("mlx*" by default), so both are
// opened to vrdma's.
func mpirunArgs(ctl, lib string, e cmEnv, tls, prog string, args ...string) []string {
	a := mpirunUCX()
	for i, side := range []struct{ sock, vm string }{{e.sockA, "vmA"}, {e.sockB, "vmB"}} {
		if i > 0 {
			a = append(a, ":")
		}
		a = append(a, "-np", "1", "-x", "UCX_TLS="+tls, "-x", "UCX_LOG_LEVEL=info", "-x", "VRDMA_VM="+side.vm,
			ctl, "--socket", side.sock, "exec", "--lib", lib, "--vm", side.vm, "--", prog)
		a = append(a, args...)
	}
	return a
}

// mpirunUCX returns mpirun's options of every job here: as root, ranks
// not bound, pml ucx on any transport and device, no BTL but self.
func mpirunUCX() []string {
	return []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
		"--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any", "--mca", "btl", "self"}
}

// needMPI skips t without Open MPI's mpirun and mpicc.
func needMPI(t *testing.T) {
	t.Helper()
	for _, p := range []string{"mpirun", "mpicc"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("no %s: install Open MPI (apt-get install -y openmpi-bin libopenmpi-dev)", p)
		}
	}
}

// TestMiddlewareMPI runs an MPI job of Debian's Open MPI 4.1 across two
// VMs — rank 0 in vmA and rank 1 in vmB, each through vrdmactl exec, in
// mpirun's MPMD form — with pml ucx on vrdma's verbs transports
// (UCX_TLS=rc_verbs,ud_verbs:aux), over memcpy, tcp and rdma: a ping-pong
// of 64 KiB messages and an allreduce of 100,000 longs
// (testdata/mpi/*.c, built with mpicc), each checking every byte it
// receives, with UCX's log naming rc_verbs on vrdma0:1 as the ranks'
// tag lane. On memcpy the same jobs run first on UCX's own tcp transport,
// which checks the launch: ranks in two VMs through vrdmactl exec.
//
// UCP connects ranks by worker address, and wires a p2p transport such
// as rc_verbs up through an auxiliary transport that UCX 1.13 finds only
// in UD: ud_verbs carries the wire-up, rc_verbs the messages.
func TestMiddlewareMPI(t *testing.T) {
	lib, ctl := needUCX(t)
	needMPI(t)
	dir := t.TempDir()
	pingpong, allreduce := mpiBuild(t, dir, "pingpong"), mpiBuild(t, dir, "allreduce")
	jobs := []mpiJob{
		{"pingpong", pingpong, []string{"200", "65536"}, regexp.MustCompile(`(?m)^pingpong ok 200 65536 `)},
		{"allreduce", allreduce, []string{"100000", "10"}, regexp.MustCompile(`(?m)^allreduce ok 2 100000 10$`)},
	}
	for _, path := range []string{"memcpy", "tcp", "rdma"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnvMem(t, path, ucxMemMB)
			if path == "memcpy" {
				// The launch itself: both ranks through vrdmactl exec, on
				// UCX's own tcp transport, the programs' checks passing.
				t.Run("launch_ucx_tcp", func(t *testing.T) {
					for _, job := range jobs {
						if out, err := runMPIJob(ctl, lib, dir, e, "tcp,self", job); err != nil || !job.ok.MatchString(out) {
							t.Fatalf("mpirun %s on UCX's tcp: %v\n%s", job.name, err, tail(out, 60))
						}
					}
				})
			}
			for _, job := range jobs {
				t.Run(job.name, func(t *testing.T) {
					before := uint64(0)
					if path != "memcpy" {
						before = uplinkBytesMoved(t, e.sockA, path, "")
					}
					out, err := runMPIJob(ctl, lib, dir, e, "rc_verbs,ud_verbs:aux", job)
					if err != nil || !job.ok.MatchString(out) {
						t.Fatalf("mpirun %s: %v\n%s", job.name, err, tail(out, 60))
					}
					if lanes := regexp.MustCompile(`ep_cfg\[\d+\]: tag\([^)]*rc_verbs/vrdma0:1`).FindAllString(out, -1); len(lanes) < 2 {
						t.Errorf("UCX's log does not show rc_verbs on vrdma0:1 as both ranks' tag lane:\n%s", tail(out, 60))
					}
					if path != "memcpy" {
						if moved := uplinkBytesMoved(t, e.sockA, path, "") - before; moved < 65536 {
							t.Errorf("hostA's %s uplinks moved %d bytes during the job: it did not take the %s path", path, moved, path)
						}
					}
					t.Logf("%s", grepLines(out, " ok "))
				})
			}
		})
	}
}

// mpiJob is one MPI program run by TestMiddlewareMPI, with the line it
// prints when its data checked.
type mpiJob struct {
	name string
	prog string
	args []string
	ok   *regexp.Regexp
}

// runMPIJob runs job with mpirun (mpirunArgs) on UCX transports tls and
// returns its output.
func runMPIJob(ctl, lib, dir string, e cmEnv, tls string, job mpiJob) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mpirun", mpirunArgs(ctl, lib, e, tls, job.prog, job.args...)...)
	cmd.Env = append(hostEnv(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// hostEnv is this process's environment without the drop-in's variables:
// mpirun's (each rank's vrdmactl exec sets its own).
func hostEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "LD_LIBRARY_PATH", "LD_PRELOAD", "VRDMA_SOCKET", "VRDMA_VM":
			continue
		}
		env = append(env, kv)
	}
	return env
}
