// SPDX-License-Identifier: Apache-2.0

package cli

// The JSON (and YAML) that vrdmactl prints with -o json: one naming
// style, snake_case, whatever the Go types' tags say (the control plane's
// records keep camelCase in etcd), and a JSON Schema derived from the same
// types (docs/json-output.md).

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"unicode"
)

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// snakeCase spells a JSON field name in snake_case: "pvrdmaAddress" is
// "pvrdma_address", "hostId" "host_id", "QPs" "qps", "MTU" "mtu"; a name
// in snake_case already stays as it is.
func snakeCase(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !unicode.IsUpper(c) {
			b.WriteRune(c)
			continue
		}
		// A word starts at an upper-case letter: "Address", or a run of
		// them, an acronym ("MTU", "QPs" with its plural s).
		j := i + 1
		for j < len(r) && unicode.IsUpper(r[j]) {
			j++
		}
		if j-i > 1 && j < len(r) && unicode.IsLower(r[j]) && !(r[j] == 's' && (j+1 == len(r) || !unicode.IsLower(r[j+1]))) {
			j-- // "HTTPServer": the last capital starts the next word
		}
		if i > 0 && r[i-1] != '_' {
			b.WriteByte('_')
		}
		b.WriteString(strings.ToLower(string(r[i:j])))
		i = j - 1
	}
	return b.String()
}

// jsonField is a struct field as encoding/json sees it.
type jsonField struct {
	index     []int
	name      string // in snake_case
	tagName   string // as encoding/json spells it
	omitEmpty bool   // omitempty or omitzero
}

// jsonFields returns t's fields as encoding/json encodes them, embedded
// structs' promoted, with their names in snake_case.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			for _, e := range jsonFields(ft) {
				e.index = append([]int{i}, e.index...)
				out = append(out, e)
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonField{index: []int{i}, name: snakeCase(name), tagName: name, omitEmpty: strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")})
	}
	return out
}

// jsonMember is a name and value of a jsonObject.
type jsonMember struct {
	name  string
	value any
}

// jsonObject is a JSON object whose members keep their order (a
// struct's fields').
type jsonObject []jsonMember

// MarshalJSON writes the object with its members in order.
func (o jsonObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.name)
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// snakeJSON returns v as vrdmactl prints it: what encoding/json would
// print, with every struct field's name in snake_case. Map keys are data
// (VM names, opcodes) and stay; types that marshal themselves stay as
// they marshal.
func snakeJSON(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	t := v.Type()
	if t.Implements(jsonMarshaler) || t.Implements(textMarshaler) {
		if (t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface) && v.IsNil() {
			return nil
		}
		return v.Interface()
	}
	if v.CanAddr() && (reflect.PointerTo(t).Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(textMarshaler)) {
		return v.Addr().Interface()
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return snakeJSON(v.Elem())
	case reflect.Struct:
		o := jsonObject{}
		for _, f := range jsonFields(t) {
			fv, err := v.FieldByIndexErr(f.index)
			if err != nil || f.omitEmpty && fv.IsZero() || f.omitEmpty && (fv.Kind() == reflect.Slice || fv.Kind() == reflect.Map) && fv.Len() == 0 {
				continue // a nil embedded pointer's fields are not there
			}
			o = append(o, jsonMember{f.name, snakeJSON(fv)})
		}
		return o
	case reflect.Map:
		if t.Key().Kind() != reflect.String || v.IsNil() {
			return v.Interface()
		}
		m := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			m[it.Key().String()] = snakeJSON(it.Value())
		}
		return m
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 || t.Kind() == reflect.Slice && v.IsNil() {
			return v.Interface()
		}
		s := make([]any, v.Len())
		for i := range s {
			s[i] = snakeJSON(v.Index(i))
		}
		return s
	}
	return v.Interface()
}

// jsonSchema returns the JSON Schema (draft 2020-12) of what snakeJSON
// prints for a value of type t: objects with their properties (those
// without omitempty required, no others allowed), arrays, maps with
// their values' schema, and the scalar types.
func jsonSchema(t reflect.Type) map[string]any {
	return schemaOf(t, map[reflect.Type]bool{}, false)
}

// tagSchema is jsonSchema of what encoding/json prints for t: the fields
// named as their tags spell them (perf's perftest keys).
func tagSchema(t reflect.Type) map[string]any {
	return schemaOf(t, map[reflect.Type]bool{}, true)
}

// schemaOf is jsonSchema, or with tagNames tagSchema.
func schemaOf(t reflect.Type, seen map[reflect.Type]bool, tagNames bool) map[string]any {
	if t.Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(jsonMarshaler) {
		return map[string]any{} // whatever it marshals to
	}
	if t.Implements(textMarshaler) || reflect.PointerTo(t).Implements(textMarshaler) {
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		s := schemaOf(t.Elem(), seen, tagNames)
		if ty, ok := s["type"].(string); ok {
			s["type"] = []any{ty, "null"}
		}
		return s
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		if seen[t] {
			return map[string]any{"type": "object"} // a recursive type: not unrolled
		}
		seen[t] = true
		defer delete(seen, t)
		props, required := map[string]any{}, []any{}
		for _, f := range jsonFields(t) {
			name := f.name
			if tagNames {
				name = f.tagName
			}
			props[name] = schemaOf(t.FieldByIndex(f.index).Type, seen, tagNames)
			if !f.omitEmpty && len(f.index) == 1 {
				required = append(required, name)
			}
		}
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	case reflect.Map:
		return map[string]any{"type": []any{"object", "null"}, "additionalProperties": schemaOf(t.Elem(), seen, tagNames)}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string"} // base64
		}
		return map[string]any{"type": []any{"array", "null"}, "items": schemaOf(t.Elem(), seen, tagNames)}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	}
	return map[string]any{}
}
