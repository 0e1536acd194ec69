// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// testFlags is a flag set like vrdmad's, small: a string, an int, a bool
// and a repeatable flag.
func testFlags() (*pflag.FlagSet, *string, *int, *bool, *[]string) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	host := fs.String("host", "", "")
	qp := fs.Int("max-qp", 512, "")
	none := fs.Bool("no-control-plane", false, "")
	var ups []string
	fs.Func("rdma-uplink", "", func(s string) error { ups = append(ups, s); return nil })
	fs.Bool("version", false, "")
	return fs, host, qp, none, &ups
}

func TestApplyConfig(t *testing.T) {
	fs, host, qp, none, ups := testFlags()
	if err := fs.Parse([]string{"--max-qp", "8"}); err != nil {
		t.Fatal(err)
	}
	err := applyConfig(fs, []byte("host: esx1\nmax-qp: 1048576\nno-control-plane: yes\nrdma-uplink: [rocev2-soft/10.0.0.1, hca/10.0.0.2]\n"))
	if err != nil || *host != "esx1" || *qp != 8 || !*none || strings.Join(*ups, " ") != "rocev2-soft/10.0.0.1 hca/10.0.0.2" {
		t.Errorf("applyConfig: %v; host %q, max-qp %d (the command line's 8 wins), no-control-plane %v, uplinks %q", err, *host, *qp, *none, *ups)
	}
	for _, c := range []struct{ file, want string }{
		{"hots: esx1\n", `unknown key "hots"`},
		{"version: true\n", `unknown key "version"`},
		{"host: [a, b]\n", "host: a list, but --host takes one value"},
		{"host: {a: b}\n", "is not a string, number or boolean"},
		{"host:\n", "host: no value"},
		{"max-qp: many\n", `max-qp: invalid argument "many"`},
		{"max-qp: 1.5\n", `max-qp: invalid argument "1.5"`},
		{"- host\n", "not a YAML mapping"},
		{"host: [\n", "not a YAML mapping"},
	} {
		fs, _, _, _, _ := testFlags()
		if err := applyConfig(fs, []byte(c.file)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("applyConfig(%q) = %v, want an error with %q", c.file, err, c.want)
		}
	}
}

func TestLongFlags(t *testing.T) {
	fs, _, _, _, _ := testFlags()
	got := longFlags(fs, []string{"-host", "h", "-max-qp=3", "--no-control-plane", "-x", "-bogus", "--", "-host"})
	if want := "--host h --max-qp=3 --no-control-plane -x -bogus -- -host"; strings.Join(got, " ") != want {
		t.Errorf("longFlags: %q, want %q", got, want)
	}
}

// FuzzApplyConfig feeds applyConfig any file: it must return, with or
// without an error, and never panic.
func FuzzApplyConfig(f *testing.F) {
	f.Add([]byte("host: esx1\nmax-qp: 8\nrdma-uplink: [a, b]\n"))
	f.Add([]byte("no-control-plane: true\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, _, _, _, _ := testFlags()
		applyConfig(fs, data)
	})
}

// TestConfigFile runs vrdmad with --config: the socket, log format and
// host come from the file, except the host, which the command line also
// sets and wins; the old single-dash spelling of a flag still works.
func TestConfigFile(t *testing.T) {
	dir, err := os.MkdirTemp("", "vrdmacfg")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "from-file.sock")
	cfg := filepath.Join(dir, "vrdmad.yaml")
	if err := os.WriteFile(cfg, []byte("socket: "+socket+"\nstate-dir: "+filepath.Join(dir, "state")+"\nhost: file-host\nno-control-plane: true\nlog-level: warn\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testenv.AgentBinary(t), "--config", cfg, "-host", "flag-host")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("vrdmad: %v\n%s", err, stderr.String())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(socket))
		if err == nil {
			if ag.Info.Host != "flag-host" {
				t.Errorf("host %q, want flag-host (the command line wins over the file)", ag.Info.Host)
			}
			ag.Close()
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no agent at the file's socket %s: %v\n%s", socket, err, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bad.yaml")
	os.WriteFile(cfg, []byte("sockte: /x\n"), 0o600)
	var out, errb strings.Builder
	if code := Main("vrdmad", []string{"--config", cfg}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `--config `+cfg+`: unknown key "sockte"`) {
		t.Errorf("a misspelt key: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := Main("vrdmad", []string{"--config", filepath.Join(dir, "none.yaml")}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "no such file") {
		t.Errorf("a missing file: exit %d, stderr %q", code, errb.String())
	}
}

// TestHelpFlag: --help prints the usage to stdout, as vrdmactl's, with
// every flag in its --long-name form; an unknown flag is a usage error on
// stderr.
func TestHelpFlag(t *testing.T) {
	var out, errb strings.Builder
	if code := Main("vrdmad", []string{"--help"}, &out, &errb); code != 0 || errb.Len() != 0 ||
		!strings.Contains(out.String(), "Usage:\n  vrdmad [flags]") || !strings.Contains(out.String(), "--config string") || !strings.Contains(out.String(), "--socket-group string") {
		t.Errorf("--help: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := Main("vrdmad", []string{"--sokcet", "x"}, &out, &errb); code != 2 || out.Len() != 0 || !strings.Contains(errb.String(), "unknown flag: --sokcet") {
		t.Errorf("--sokcet: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
