package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPerfJSON(t *testing.T) {
	tmp := isolate(t)
	for _, tc := range []struct {
		args []string
		keys []string
	}{
		{[]string{"perf", "write_bw", "--local", "--path", "memcpy", "-s", "4096", "-n", "300", "--out_json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}},
		{[]string{"perf", "read_bw", "--local", "--path", "memcpy", "-s", "65536", "-n", "100", "-t", "16", "-o", "json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}},
		{[]string{"perf", "write_lat", "--local", "--path", "memcpy", "-s", "8", "-n", "200", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}},
	} {
		var m map[string]any
		runJSON(t, &m, tc.args...)
		for _, k := range append(tc.keys, "MsgSize", "n_iterations") {
			if v, ok := m[k].(float64); !ok || v <= 0 {
				t.Errorf("%v: key %q = %v, want a positive number", tc.args, k, m[k])
			}
		}
		test := tc.args[1]
		if m["test"] != test || m["path"] != "memcpy" || !strings.HasPrefix(m["reason"].(string), "memcpy: ") {
			t.Errorf("%v: test %v path %v reason %v", tc.args, m["test"], m["path"], m["reason"])
		}
		if info, ok := m["test_info"].(map[string]any); !ok || info["Transport"] != "memcpy" || info["Connection_type"] != "RC" {
			t.Errorf("%v: test_info %v", tc.args, m["test_info"])
		}
		if n := m["n_iterations"].(float64); n != float64(atoi(t, tc.args[8])) {
			t.Errorf("%v: %v iterations", tc.args, n)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("perf left %v in TMPDIR", left)
	}
}

func atoi(t *testing.T, s string) int {
	var n int
	if err := json.Unmarshal([]byte(s), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPerfText(t *testing.T) {
	isolate(t)
	out := runOK(t, "perf", "write_bw", "--local", "--path", "memcpy", "-s", "65536", "-n", "200")
	for _, want := range []string{"RDMA_Write BW Test", " Transport       : memcpy", " Path reason     : memcpy: ",
		"#bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]", " 65536      200 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out = runOK(t, "perf", "write_lat", "--local", "-s", "2", "-n", "100", "--async")
	for _, want := range []string{"RDMA_Write Latency Test", "t_typical[usec]", "99.9% percentile[usec]", " 2       100 ", "async"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPerfAllSizesToFile(t *testing.T) {
	isolate(t)
	file := filepath.Join(t.TempDir(), "report.json")
	out := runOK(t, "perf", "write_bw", "--local", "-a", "-n", "20", "--out_json_file", file)
	if !strings.Contains(out, " 8388608    20 ") {
		t.Errorf("text output lacks the 2^23 line:\n%s", out)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Path    string `json:"path"`
		Results []struct {
			MsgSize   int     `json:"MsgSize"`
			BWAverage float64 `json:"BW_average"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Path != "memcpy" || len(rep.Results) != 23 || rep.Results[0].MsgSize != 2 || rep.Results[22].MsgSize != 1<<23 {
		t.Fatalf("report %s", b)
	}
}

func TestPerfWrongPath(t *testing.T) {
	tmp := isolate(t)
	out, errs, code := run(t, "", "perf", "write_bw", "--local", "--path", "tcp", "-n", "10", "--out_json")
	if code != exitFailure {
		t.Fatalf("--path tcp: exit %d, want 1; stderr %q", code, errs)
	}
	if !strings.Contains(errs, `"tcp"`) || !strings.Contains(errs, `"memcpy"`) {
		t.Errorf("error does not name both paths: %q", errs)
	}
	if out != "" {
		t.Errorf("stdout %q: want nothing", out)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("perf left %v in TMPDIR", left)
	}
}
