// SPDX-License-Identifier: Apache-2.0

// Package packaging builds vrdma's Debian packages: build-deb, a script run
// from the repository (packaging/build-deb --help), makes vrdma,
// vrdma-dropin and vrdma-etcd with dpkg-deb; version names the checkout
// from git's tags, the version build-deb gives the packages and stamps
// into the binaries; gen-man writes the man pages from the commands' help
// texts; dropin-hash stamps the drop-in libraries with the digest of their
// sources. This package holds no code of its own: its tests install the
// packages into a clean Debian root and run the agent and unmodified
// programs there as a normal user, and run version through a release's
// life.
package packaging
