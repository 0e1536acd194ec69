// Package packaging builds vrdma's Debian packages: build-deb, a script run
// from the repository (packaging/build-deb --help), makes vrdma,
// vrdma-dropin and vrdma-etcd with dpkg-deb; dropin-hash stamps the drop-in
// libraries with the digest of their sources. This package holds no code of
// its own: its test installs the packages into a clean Debian root and runs
// the agent and unmodified programs there as a normal user.
package packaging
