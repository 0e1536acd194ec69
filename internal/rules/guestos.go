// SPDX-License-Identifier: Apache-2.0

package rules

import "strings"

// Guest OS IDs are the VMX spelling of vSphere's VirtualMachineGuestOsIdentifier
// (open-vm-tools lib/include/guest_os_tables.h, GUEST_OS_KEY_MAP): a family
// name, often a version, and "-64" for a 64-bit guest ("rhel9-64",
// "other5xlinux-64", "ubuntu-64"). Arm guests start with "arm-".

// guestKind is what a guestOS ID says about the guest.
type guestKind int

const (
	guestUnknown  guestKind = iota // not an ID of a known family
	guestLinux64                   // a 64-bit x86 Linux guest: what PVRDMA needs
	guestLinux32                   // a 32-bit Linux guest
	guestArmLinux                  // an Arm Linux guest: ESXi on Arm has no PVRDMA
	guestOther                     // not Linux (Windows, macOS, BSD, Solaris, ESXi, ...)
)

// linuxFamilies are the guest ID families that are Linux. An ID is in a
// family if it is the family name followed by an optional version made of
// digits, "x" and "_" (rhel9, debian12, other5xlinux is "other" + "5x" +
// "linux" and is listed whole), then an optional "-64".
var linuxFamilies = []string{
	"almalinux", "amazonlinux", "asianux", "centos", "coreos", "crxpod", "crxsys", "debian",
	"fedora", "fusionos", "genericlinux", "kylinlinux", "linux", "linuxmint", "mandrake",
	"mandriva", "miraclelinux", "nld", "oes", "openeuler", "opensuse", "oraclelinux",
	"otherlinux", "pardus", "prolinux", "redhat", "rhel", "rockylinux", "sjds", "sles",
	"suse", "turbolinux", "ubuntu", "vmware-photon",
	// otherNxlinux: other24xlinux, other26xlinux, other3xlinux ... other7xlinux
	"other24xlinux", "other26xlinux", "other3xlinux", "other4xlinux", "other5xlinux",
	"other6xlinux", "other7xlinux",
}

// otherFamilies are guest ID families that are not Linux.
var otherFamilies = []string{
	"darwin", "dos", "ecomstation", "freebsd", "longhorn", "netware", "nt", "openserver",
	"os2", "other", "solaris", "unixware", "vmkernel", "whistler", "win", "windows",
}

// classifyGuest returns what guestOS ID id says about the guest.
func classifyGuest(id string) guestKind {
	id = strings.ToLower(strings.TrimSpace(id))
	arm := false
	if rest, ok := strings.CutPrefix(id, "arm-"); ok {
		arm, id = true, rest
	}
	bits64 := false
	if rest, ok := strings.CutSuffix(id, "-64"); ok {
		bits64, id = true, rest
	}
	switch {
	case inFamily(id, linuxFamilies):
		switch {
		case arm:
			return guestArmLinux
		case bits64:
			return guestLinux64
		}
		return guestLinux32
	case inFamily(id, otherFamilies), strings.HasPrefix(id, "win"):
		return guestOther
	}
	return guestUnknown
}

// inFamily reports whether id is one of families, followed by an optional
// version of digits, 'x' and '_' that starts with a digit.
func inFamily(id string, families []string) bool {
	for _, f := range families {
		rest, ok := strings.CutPrefix(id, f)
		if !ok {
			continue
		}
		if rest == "" {
			return true
		}
		if rest[0] < '0' || rest[0] > '9' {
			continue
		}
		okVersion := true
		for i := 0; i < len(rest); i++ {
			if c := rest[i]; !('0' <= c && c <= '9' || c == 'x' || c == '_') {
				okVersion = false
				break
			}
		}
		if okVersion {
			return true
		}
	}
	return false
}

// guest64Suggestion returns a 64-bit Linux guest ID to suggest instead of
// the 32-bit Linux ID id.
func guest64Suggestion(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	switch id {
	case "redhat", "linux", "genericlinux":
		return "otherlinux-64"
	}
	return id + "-64"
}
