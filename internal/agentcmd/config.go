// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// longFlags returns args with the single-dash spellings of fs's long
// flags ("-socket", "-max-qp=8", which vrdmad took when it parsed with
// the standard flag package) written with two dashes, as pflag wants
// them. Arguments after "--" and unknown names are left alone.
func longFlags(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "--" {
			copy(out[i:], args[i:])
			break
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(name) > 1 && fs.Lookup(name) != nil {
			a = "-" + a
		}
		out[i] = a
	}
	return out
}

// notInFile are the flags a config file may not set.
var notInFile = []string{"config", "version", "help"}

// applyConfig sets fs's flags from data, a YAML mapping whose keys are
// flag names and whose values are scalars (strings, numbers, booleans) or,
// for a flag that may be given more than once (rdma-uplink), lists of
// them. A flag set on the command line keeps its value: the command line
// wins over the file. Unknown keys and values of the wrong shape are
// errors.
func applyConfig(fs *pflag.FlagSet, data []byte) error {
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("not a YAML mapping of flag names to values: %v", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f := fs.Lookup(k)
		if f == nil || slices.Contains(notInFile, k) {
			return fmt.Errorf("unknown key %q: the keys are vrdmad's flag names without the dashes (vrdmad --help lists them), except %s", k, strings.Join(notInFile, ", "))
		}
		if f.Changed {
			continue
		}
		vals := []any{m[k]}
		if l, ok := m[k].([]any); ok {
			if f.Value.Type() != "func" {
				return fmt.Errorf("%s: a list, but --%s takes one value", k, k)
			}
			vals = l
		}
		for _, v := range vals {
			s, err := scalar(v)
			if err != nil {
				return fmt.Errorf("%s: %v", k, err)
			}
			if err := fs.Set(k, s); err != nil {
				return fmt.Errorf("%s: %v", k, err)
			}
		}
	}
	return nil
}

// scalar returns the flag value v, a YAML scalar, spells.
func scalar(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case bool:
		return strconv.FormatBool(v), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case nil:
		return "", errors.New("no value")
	default:
		return "", fmt.Errorf("%v is not a string, number or boolean", v)
	}
}
