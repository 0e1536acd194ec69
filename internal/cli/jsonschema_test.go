// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/nativepeer"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

var updateSchemas = flag.Bool("update-schemas", false, "write docs/schema/*.json from the -o json outputs the tests print")

// printed is every -o json output the tests printed: command → the Go
// types printed, and the documents (as printed, snake_case).
var printed = struct {
	sync.Mutex
	types map[string]map[reflect.Type]bool
	docs  []printedDoc
}{types: map[string]map[reflect.Type]bool{}}

type printedDoc struct {
	command string
	t       reflect.Type
	doc     []byte
}

// recordJSON is jsonPrinted in the tests.
func recordJSON(command string, v any) {
	t := reflect.TypeOf(v)
	b, err := json.Marshal(snakeJSON(reflect.ValueOf(v)))
	if err != nil {
		b = []byte(fmt.Sprintf("%q", err.Error()))
	}
	printed.Lock()
	defer printed.Unlock()
	if printed.types[command] == nil {
		printed.types[command] = map[reflect.Type]bool{}
	}
	printed.types[command][t] = true
	printed.docs = append(printed.docs, printedDoc{command, t, b})
}

// namePattern is the spelling of every field name vrdmactl prints.
const namePattern = `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`

// commandSchema is the JSON Schema of command's -o json output: that of
// the Go type it prints, or anyOf those of the types it prints (alts,
// each a schema as JSON).
func commandSchema(command string, alts []string) map[string]any {
	s := map[string]any{"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "vrdmactl " + command + " -o json"}
	var ss []any
	for _, a := range alts {
		var m map[string]any
		json.Unmarshal([]byte(a), &m)
		ss = append(ss, m)
	}
	if len(ss) == 1 && ss[0].(map[string]any)["anyOf"] == nil { // one alternative of its own alternatives (perf) stays one
		for k, v := range ss[0].(map[string]any) {
			s[k] = v
		}
	} else {
		s["anyOf"] = ss
	}
	return s
}

// schemaAlts returns the schemas a command schema allows, each as JSON.
func schemaAlts(s map[string]any) []string {
	var out []string
	if alts, ok := s["anyOf"].([]any); ok {
		for _, a := range alts {
			b, _ := json.Marshal(a)
			out = append(out, string(b))
		}
		return out
	}
	m := map[string]any{}
	for k, v := range s {
		if k != "$schema" && k != "title" {
			m[k] = v
		}
	}
	b, _ := json.Marshal(m)
	return []string{string(b)}
}

// typeSchema is jsonSchema, but a map[string]any printed whole is an
// object whose keys (the code's names, not data) are snake_case, and
// perf's report is perfSchema.
func typeSchema(t reflect.Type) map[string]any {
	switch t {
	case reflect.TypeFor[map[string]any]():
		return map[string]any{"type": "object", "propertyNames": map[string]any{"pattern": namePattern}}
	case reflect.TypeFor[perfDocument]():
		return perfSchema()
	}
	return jsonSchema(t)
}

// perfSchema is the schema of perf's report (perfJSON), whose keys are
// perftest's: test, path, reason and test_info (perfInfo), and either one
// size's figures beside them (perfBW or perfLat) or, with -a, every
// size's in results.
func perfSchema() map[string]any {
	object := func(parts ...map[string]any) map[string]any {
		props, required := map[string]any{}, []any{}
		for _, p := range parts {
			for k, v := range p["properties"].(map[string]any) {
				props[k] = v
			}
			required = append(required, asSlice(p["required"])...)
		}
		return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
	}
	str := map[string]any{"type": "string"}
	head := map[string]any{"properties": map[string]any{"test": str, "path": str, "reason": str, "test_info": tagSchema(reflect.TypeFor[perfInfo]())},
		"required": []any{"test", "path", "reason", "test_info"}}
	bw, lat := tagSchema(reflect.TypeFor[perfBW]()), tagSchema(reflect.TypeFor[perfLat]())
	all := map[string]any{"properties": map[string]any{"results": map[string]any{"type": "array", "items": map[string]any{"anyOf": []any{bw, lat}}}}, "required": []any{"results"}}
	return map[string]any{"anyOf": []any{object(head, bw), object(head, lat), object(head, all)}}
}

// validate checks doc against schema s (the keywords jsonSchema uses:
// type, properties, required, additionalProperties, items,
// propertyNames, anyOf) and returns what does not conform.
func validate(s map[string]any, doc any, path string) []string {
	var errs []string
	if alts, ok := s["anyOf"].([]any); ok {
		for _, a := range alts {
			if len(validate(a.(map[string]any), doc, path)) == 0 {
				return nil
			}
		}
		return []string{path + ": matches none of the anyOf schemas"}
	}
	if ty, ok := s["type"]; ok {
		var types []any
		switch ty := ty.(type) {
		case string:
			types = []any{ty}
		case []any:
			types = ty
		}
		if !slices.ContainsFunc(types, func(t any) bool { return jsonType(doc, t.(string)) }) {
			return []string{fmt.Sprintf("%s: %s, want %v", path, jsonTypeOf(doc), ty)}
		}
	}
	switch doc := doc.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for _, r := range asSlice(s["required"]) {
			if _, ok := doc[r.(string)]; !ok {
				errs = append(errs, fmt.Sprintf("%s: no %q", path, r))
			}
		}
		if pn, ok := s["propertyNames"].(map[string]any); ok {
			re := regexp.MustCompile(pn["pattern"].(string))
			for k := range doc {
				if !re.MatchString(k) {
					errs = append(errs, fmt.Sprintf("%s: name %q is not %s", path, k, re))
				}
			}
		}
		for k, v := range doc {
			if ps, ok := props[k].(map[string]any); ok {
				errs = append(errs, validate(ps, v, path+"."+k)...)
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case bool:
				if !ap {
					errs = append(errs, fmt.Sprintf("%s: %q is not in the schema", path, k))
				}
			case map[string]any:
				errs = append(errs, validate(ap, v, path+"."+k)...)
			}
		}
	case []any:
		if items, ok := s["items"].(map[string]any); ok {
			for i, v := range doc {
				errs = append(errs, validate(items, v, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	}
	return errs
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func jsonTypeOf(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		if strings.ContainsAny(v.String(), ".eE") {
			return "number"
		}
		return "integer"
	case string:
		return "string"
	case []any:
		return "array"
	}
	return "object"
}

func jsonType(v any, t string) bool {
	got := jsonTypeOf(v)
	return got == t || t == "number" && got == "integer"
}

// checkPrinted checks every -o json output the tests printed against its
// command's schema and docs/schema (or, with -update-schemas, writes
// docs/schema); it returns what failed.
func checkPrinted() []string {
	printed.Lock()
	defer printed.Unlock()
	var errs []string
	dir := filepath.Join("..", "..", "docs", "schema")
	for cmd, types := range printed.types {
		file := filepath.Join(dir, strings.ReplaceAll(cmd, " ", "-")+".json")
		var have []string
		if b, err := os.ReadFile(file); err == nil {
			var s map[string]any
			if err := json.Unmarshal(b, &s); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", file, err))
				continue
			}
			have = schemaAlts(s)
		}
		// A run of some of the tests prints some of a command's types:
		// each must be in the file, which may hold more.
		// Each alternative names its Go type ($comment): an update
		// replaces that type's.
		alts := slices.Clone(have)
		changed := false
		for t := range types {
			ts := typeSchema(t)
			ts["$comment"] = "Go type " + t.String()
			b, _ := json.Marshal(ts)
			if slices.Contains(have, string(b)) {
				continue
			}
			if !*updateSchemas {
				errs = append(errs, fmt.Sprintf("%s does not hold the schema of vrdmactl %s -o json printing a %s: go test ./internal/cli -update-schemas writes it", file, cmd, t))
			}
			alts = slices.DeleteFunc(alts, func(a string) bool { return strings.Contains(a, `"$comment":"Go type `+t.String()+`"`) })
			alts = append(alts, string(b))
			changed = true
		}
		slices.Sort(alts)
		want, err := json.MarshalIndent(commandSchema(cmd, alts), "", "  ")
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		want = append(want, '\n')
		if *updateSchemas && changed {
			if err := os.WriteFile(file, want, 0o644); err != nil {
				errs = append(errs, err.Error())
			}
		}
		// The schema as a document, as it is published.
		var pub map[string]any
		json.Unmarshal(want, &pub)
		for _, d := range printed.docs {
			if d.command != cmd {
				continue
			}
			dec := json.NewDecoder(bytes.NewReader(d.doc))
			dec.UseNumber()
			var doc any
			if err := dec.Decode(&doc); err != nil {
				errs = append(errs, fmt.Sprintf("vrdmactl %s -o json: not JSON: %v", cmd, err))
				continue
			}
			for _, e := range validate(pub, doc, "$") {
				errs = append(errs, fmt.Sprintf("vrdmactl %s -o json (%s) does not conform to its schema: %s\n%s", cmd, d.t, e, d.doc))
			}
		}
	}
	return errs
}

func TestSnakeCase(t *testing.T) {
	for in, want := range map[string]string{
		"pvrdmaAddress": "pvrdma_address", "hostId": "host_id", "QPs": "qps", "MTU": "mtu", "roceMtu": "roce_mtu",
		"sinceUnixMs": "since_unix_ms", "already_snake": "already_snake", "Name": "name", "PeerHost": "peer_host",
		"HTTPServer": "http_server", "dcbDevice": "dcb_device", "leaseAgeS": "lease_age_s", "VMs": "vms", "CQsUsed": "cqs_used",
	} {
		if got := snakeCase(in); got != want {
			t.Errorf("snakeCase(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSnakeJSON checks what printJSON prints of a value: struct fields
// in snake_case, in order, with omitempty honoured and embedded fields
// promoted; map keys (data) and self-marshalling types as they are.
func TestSnakeJSON(t *testing.T) {
	type Inner struct {
		PortGroup string `json:"portGroup"`
	}
	type outer struct {
		Inner
		HostID   string            `json:"hostId"`
		Skip     string            `json:"skip,omitempty"`
		Counts   map[string]uint64 `json:"opCounts"`
		Raw      json.RawMessage   `json:"rawDoc"`
		List     []Inner           `json:"list"`
		Ptr      *Inner            `json:"ptr,omitempty"`
		internal int
	}
	v := outer{Inner: Inner{"pg1"}, HostID: "h", Counts: map[string]uint64{"RDMA_WRITE": 1, "myVm": 2}, Raw: json.RawMessage(`{"keepMe":1}`), List: []Inner{{"a"}}}
	b, err := json.Marshal(snakeJSON(reflect.ValueOf(v)))
	want := `{"port_group":"pg1","host_id":"h","op_counts":{"RDMA_WRITE":1,"myVm":2},"raw_doc":{"keepMe":1},"list":[{"port_group":"a"}]}`
	if err != nil || string(b) != want {
		t.Errorf("snakeJSON: %s, %v\nwant %s", b, err, want)
	}
	s := jsonSchema(reflect.TypeOf(v))
	var doc any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	dec.Decode(&doc)
	if errs := validate(s, doc, "$"); len(errs) > 0 {
		t.Errorf("snakeJSON's output does not conform to jsonSchema: %v", errs)
	}
	// The validator can fail: a camelCase name, a missing field, a wrong type.
	for _, bad := range []string{
		`{"portGroup":"pg1","host_id":"h","op_counts":{},"raw_doc":1,"list":[]}`,
		`{"port_group":"pg1","op_counts":{},"raw_doc":1,"list":[]}`,
		`{"port_group":1,"host_id":"h","op_counts":{},"raw_doc":1,"list":[]}`,
		`{"port_group":"p","host_id":"h","op_counts":{"x":"y"},"raw_doc":1,"list":[]}`,
	} {
		var doc any
		json.Unmarshal([]byte(bad), &doc)
		if len(validate(s, doc, "$")) == 0 {
			t.Errorf("%s conforms to the schema", bad)
		}
	}
}

// unmarshalPrinted decodes what printJSON printed into v, whose type
// printed it: the inverse of snakeJSON, which renamed its fields.
func unmarshalPrinted(data []byte, v any) error {
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		return err
	}
	b, err := json.Marshal(fromSnake(doc, reflect.TypeOf(v)))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// fromSnake renames doc's fields from snake_case back to the names of
// type t's fields, as encoding/json reads them.
func fromSnake(doc any, t reflect.Type) any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(jsonMarshaler) {
		return doc
	}
	switch d := doc.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Struct:
			out := map[string]any{}
			fields := map[string]jsonField{}
			for _, f := range jsonFields(t) {
				fields[f.name] = f
			}
			for k, v := range d {
				if f, ok := fields[k]; ok {
					out[f.tagName] = fromSnake(v, t.FieldByIndex(f.index).Type)
				} else {
					out[k] = v
				}
			}
			return out
		case reflect.Map:
			for k, v := range d {
				d[k] = fromSnake(v, t.Elem())
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, v := range d {
				d[i] = fromSnake(v, t.Elem())
			}
		}
	}
	return doc
}

// TestJSONOutputs runs, with -o json, the commands that print JSON and
// that no other test runs so: their outputs then go through the schema
// check of TestMain like every other.
func TestJSONOutputs(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	a := testenv.StartControl(t, "esx1", hostCfg(ep, "127.0.0.1", false))
	fabric(t, ep)
	cp := []string{"--etcd-endpoints", ep, "-o", "json"}
	on := []string{"--socket", a.Socket, "--etcd-endpoints", ep, "-o", "json"}
	vmx := filepath.Join(t.TempDir(), "v9.vmx")
	if err := os.WriteFile(vmx, []byte(testenv.VMX(testenv.VMOptions{})), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		append(slices.Clone(cp), "switch", "create", "dvs9"),
		append(slices.Clone(cp), "switch", "list"),
		append(slices.Clone(cp), "switch", "set", "dvs9", "--mtu", "9000"),
		append(slices.Clone(cp), "switch", "router", "set", "dvs9", "r1", "--subnet", "10.9.0.0/24", "--subnet", "10.9.1.0/24"),
		append(slices.Clone(cp), "switch", "router", "remove", "dvs9", "r1"),
		append(slices.Clone(cp), "portgroup", "create", "dvportgroup-90", "--switch", "dvs9", "--vlan", "90"),
		append(slices.Clone(cp), "portgroup", "list"),
		append(slices.Clone(cp), "portgroup", "show", "dvportgroup-90"),
		append(slices.Clone(cp), "portgroup", "set", "dvportgroup-90", "--vlan", "91"),
		append(slices.Clone(cp), "portgroup", "delete", "dvportgroup-90"),
		append(slices.Clone(cp), "switch", "delete", "dvs9"),
		append(slices.Clone(on), "vm", "define", "v9", vmx),
		append(slices.Clone(on), "vm", "undefine", "v9"),
		append(slices.Clone(on), "vm", "create", "w9", "--memory", "4"),
		append(slices.Clone(on), "vm", "set", "w9", "memSize=8"),
		append(slices.Clone(on), "vm", "edit", "w9", "--add-adapter", "--portgroup", "dvportgroup-10"),
		append(slices.Clone(on), "vm", "reserve-memory", "w9", "--all"),
	} {
		var v any
		runJSON(t, &v, args...)
	}

	// A host with an RDMA uplink: its uplink declared, then, once its
	// agent is gone and its lease has run out, the host removed.
	t.Run("esx8", func(t *testing.T) { // its agent stops at the subtest's end
		testenv.StartControl(t, "esx8", hostCfg(ep, "127.0.8.1", true))
		var decl uplinkDeclareReport
		runJSON(t, &decl, append(slices.Clone(cp), "host", "uplink", "declare", "esx8", "127.0.8.1", "--pfc", "3")...)
		if decl.Name != "esx8" || decl.Uplink.Declared.PFC == nil {
			t.Errorf("host uplink declare -o json: %+v", decl)
		}
	})
	var rm hostRemoveReport
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, errs, code := run(t, "", append(slices.Clone(cp), "host", "remove", "esx8")...)
		if code == exitOK {
			if err := unmarshalPrinted([]byte(out), &rm); err != nil {
				t.Fatalf("host remove -o json: %v\n%s", err, out)
			}
			break
		}
		if !strings.Contains(errs, "is up") || time.Now().After(deadline) {
			t.Fatalf("host remove esx8: exit %d\n%s%s", code, out, errs)
		}
	}
	if rm.Name != "esx8" || rm.VMsRemoved == nil {
		t.Errorf("host remove -o json: %+v", rm)
	}
	var fk forgetKeyReport
	runJSON(t, &fk, append(slices.Clone(cp), "--state-dir", t.TempDir(), "host", "forget-key", "esx1")...)
	if fk.Host == "" || fk.Forgotten || fk.Pins == "" {
		t.Errorf("host forget-key -o json (nothing pinned): %+v", fk)
	}

	// soak's report, as soak prints it (a soak runs for minutes; its
	// tests read the report without -o json).
	s := &app{stdout: io.Discard, output: "json", command: "soak"}
	if err := s.printJSON(soakReport{OK: true, Hosts: map[string]string{"host1": "memcpy"}}); err != nil {
		t.Fatal(err)
	}
	// native-peer's, as it prints it (its tests run it between network
	// namespaces, in tests/).
	np := &app{stdout: io.Discard, output: "json", command: "native-peer"}
	if err := np.printJSON(nativePeerReport{Role: "active", Local: nativepeer.Info{GID: netip.MustParseAddr("::ffff:10.0.0.1"), QPN: 17, PSN: 1, RKey: 2, Addr: 4096, Size: 64},
		Result: []nativepeer.Result{{Op: "SEND", Latency: time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []perf.Result{{Test: perf.WriteBW, MsgSize: 65536, Iters: 10, BWPeak: 2, BWAvg: 1, MsgRate: 0.01}, {Test: perf.ReadLat, MsgSize: 2, Iters: 10, TMin: 1, TTypical: 2, TAvg: 2, TMax: 3, P99: 3}} {
		r.Path = vrdma.PathInfo{Path: vrdma.PathRDMA, Reason: "rdma: native endpoint"}
		if err := np.printJSON(nativeBench("active", r)); err != nil {
			t.Fatal(err)
		}
	}
}

// noSchema are the commands whose output is not a vrdmactl JSON document,
// and why: every other command a user can run has a schema.
var noSchema = map[string]string{
	"completion bash":       "prints a shell script",
	"completion zsh":        "prints a shell script",
	"completion fish":       "prints a shell script",
	"completion powershell": "prints a shell script",
	"exec":                  "runs a program: the output is the program's",
	"help":                  "prints a command's help",
	"console":               "serves the web console until interrupted (its JSON API is the pages', docs/console.md)",
}

// TestJSONSchemasCover: every command a user can run (groups of commands
// print their help) has its schema in
// docs/schema, unless noSchema says why it prints no JSON document; every
// schema is of a command.
func TestJSONSchemasCover(t *testing.T) {
	root := Command()
	root.InitDefaultCompletionCmd()
	want := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		if name := strings.TrimPrefix(c.CommandPath(), "vrdmactl "); c.Runnable() && !c.HasSubCommands() && noSchema[name] == "" {
			want[strings.ReplaceAll(name, " ", "-")+".json"] = true
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	dir := filepath.Join("..", "..", "docs", "schema")
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		have[f.Name()] = true
		if !want[f.Name()] {
			t.Errorf("docs/schema/%s is the schema of no command", f.Name())
		}
	}
	for f := range want {
		if !have[f] {
			t.Errorf("vrdmactl %s has no schema docs/schema/%s: run it with -o json in a test (TestJSONOutputs) and go test ./internal/cli -update-schemas, or say in noSchema why it prints no JSON", strings.ReplaceAll(strings.TrimSuffix(f, ".json"), "-", " "), f)
		}
	}
	if len(want) < 40 {
		t.Errorf("only %d commands found: the walk is broken", len(want))
	}
}

// TestPerfSchema checks perf's reports against perfSchema: one size of a
// BW and of a latency test, and every size (-a), conform; a report with a
// figure of the wrong type, an unknown key or without test_info does not.
func TestPerfSchema(t *testing.T) {
	s := perfSchema()
	info := perfInfo{Test: "write_bw", Title: "RDMA_Write BW Test", Path: "memcpy"}
	bw := perfResult{Result: perf.Result{Test: perf.WriteBW, MsgSize: 4096, Iters: 100, BWPeak: 10, BWAvg: 9, MsgRate: 0.5}}
	lat := perfResult{Result: perf.Result{Test: perf.WriteLat, MsgSize: 2, Iters: 100, TMin: 1, TMax: 3, TTypical: 2, TAvg: 2, P99: 3, P999: 3}}
	decode := func(b []byte) map[string]any {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for name, rs := range map[string][]perfResult{"bw": {bw}, "lat": {lat}, "all": {bw, bw}} {
		b, err := perfJSON(info, rs, name == "all")
		if err != nil {
			t.Fatal(err)
		}
		if errs := validate(s, decode(b), "$"); len(errs) > 0 {
			t.Errorf("%s: %v\n%s", name, errs, b)
		}
		for bad, mod := range map[string]func(m map[string]any){
			"a string MsgSize": func(m map[string]any) {
				if r, ok := m["results"].([]any); ok {
					r[0].(map[string]any)["MsgSize"] = "big"
				} else {
					m["MsgSize"] = "big"
				}
			},
			"an unknown key":   func(m map[string]any) { m["bandwidth"] = 1 },
			"no test_info":     func(m map[string]any) { delete(m, "test_info") },
			"a snake_case key": func(m map[string]any) { m["test_info"].(map[string]any)["number_of_qps"] = 1 },
		} {
			m := decode(b)
			mod(m)
			if len(validate(s, m, "$")) == 0 {
				t.Errorf("%s with %s conforms", name, bad)
			}
		}
	}
}
