package cli

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestQuickstartKeep runs "vrdmactl quickstart --keep" as a process, takes
// the commands it prints once ready, and runs them: unmodified ib_write_bw
// (perftest) on the drop-in libibverbs across each pair — memcpy, tcp and
// rdma — each completing with a bandwidth line; then interrupts it, and it
// removes everything and exits 0.
func TestQuickstartKeep(t *testing.T) {
	for _, tool := range []string{"gcc", "make", "objdump", "ib_write_bw"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: install gcc make libibverbs-dev perftest", tool)
		}
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("no <infiniband/verbs.h>: install libibverbs-dev")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/vrdmactl", "./cmd/vrdmad")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	env := append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(), libEnv+"=", "PATH="+bin+":"+os.Getenv("PATH"))
	qs := exec.Command(filepath.Join(bin, "vrdmactl"), "quickstart", "--keep")
	qs.Env = env
	stdout, err := qs.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	qs.Stderr = os.Stderr
	if err := qs.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	t.Cleanup(func() {
		qs.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			qs.Process.Kill()
		}
	})
	lines := make(chan string, 256)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		done <- qs.Wait()
	}()
	var out []string
	var cmds []string
	ready := false
	for deadline := time.After(3 * time.Minute); !ready || len(cmds) < 6; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("quickstart --keep ended before it was ready:\n%s", strings.Join(out, "\n"))
			}
			out = append(out, l)
			switch {
			case l == "ready":
				ready = true
			case ready && strings.Contains(l, " exec --vm "):
				cmds = append(cmds, l)
			}
		case <-deadline:
			t.Fatalf("quickstart --keep not ready in 3 minutes:\n%s", strings.Join(out, "\n"))
		}
	}
	bw := regexp.MustCompile(`(?m)^\s*65536\s+100\s+[0-9.]+\s+[0-9.]+`)
	for i := 0; i+1 < len(cmds); i += 2 {
		server := exec.Command("sh", "-c", strings.TrimSuffix(cmds[i], " &")+" -n 100")
		server.Env = env
		var sout strings.Builder
		server.Stdout, server.Stderr = &sout, &sout
		if err := server.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the server listens (perftest's own exchange)
		client := exec.Command("sh", "-c", cmds[i+1]+" -n 100")
		client.Env = env
		cout, err := client.CombinedOutput()
		serr := server.Wait()
		if err != nil || serr != nil || !bw.Match(cout) {
			t.Errorf("pair %d: %s\n%s\n-> %v, server %v:\n%s\nserver:\n%s", i/2+1, cmds[i], cmds[i+1], err, serr, cout, sout.String())
		}
	}
	qs.Process.Signal(syscall.SIGINT)
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if err := <-done; err != nil {
		t.Errorf("quickstart --keep after SIGINT: %v\n%s", err, strings.Join(rest, "\n"))
	}
	done <- nil // for the cleanup
	if all := strings.Join(rest, "\n"); !strings.Contains(all, "the agents and their temporary state are gone") {
		t.Errorf("quickstart --keep's last words:\n%s", all)
	}
}
