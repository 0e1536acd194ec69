// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"
	"strings"
)

// RuleEtcdTLS names the rule that refuses a control plane reached over
// plaintext TCP unless the operator accepts it.
const RuleEtcdTLS = "etcd-tls"

// PlaintextEndpoint returns the first of endpoints that a client with tls
// would reach over plaintext TCP, "" if none: an http:// endpoint, or one
// without a scheme (host:port) when tls names no file. Unix sockets
// (unix://, unixs://) are local and guarded by their file permissions;
// https:// is TLS.
func PlaintextEndpoint(endpoints []string, tls TLSFiles) string {
	hasTLS := tls != TLSFiles{}
	for _, e := range endpoints {
		scheme, _, ok := strings.Cut(e, "://")
		switch {
		case !ok:
			if !hasTLS {
				return e
			}
		case strings.EqualFold(scheme, "http"):
			return e
		}
	}
	return ""
}

// CheckPlaintext returns the refusal of rule etcd-tls for the first
// plaintext TCP endpoint (see PlaintextEndpoint), nil if there is none.
// flags names the command's TLS flags in the fix ("--etcd-cert/--etcd-key/
// --etcd-ca") and insecure its opt-in flag ("--insecure-etcd").
func CheckPlaintext(endpoints []string, tls TLSFiles, flags, insecure string) error {
	e := PlaintextEndpoint(endpoints, tls)
	if e == "" {
		return nil
	}
	return fmt.Errorf("rule %s: the control plane at %s is plaintext TCP: anyone on the network can read and write it; give %s (with https:// endpoints), or %s to accept that", RuleEtcdTLS, e, flags, insecure)
}
