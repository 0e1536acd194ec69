#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run by TestPackageInstall inside private mount, PID and network
# namespaces (unshare): everything mounted here, and every process started,
# ends with this script. Environment: ROOTFS, a clean Debian root (read
# only: an overlay takes the writes); WORK, an empty directory; DEBS, the
# directory of the .deb files. It installs the packages as dpkg does on a
# host (vrdma-etcd too: it runs), starts vrdmad with the installed unit's ExecStart, defines two VMs
# for user alice (group vrdma) and runs unmodified programs as alice.
set -euo pipefail
m=$WORK/root
mkdir -p "$WORK/upper" "$WORK/ovl" "$m"
mount -t overlay overlay -o "lowerdir=$ROOTFS,upperdir=$WORK/upper,workdir=$WORK/ovl" "$m"
mount -t proc proc "$m/proc"
mount -t sysfs sysfs "$m/sys"
mount --rbind /dev "$m/dev"
mount -t tmpfs tmpfs "$m/dev/shm"
mount -t tmpfs tmpfs "$m/run"
mount -t tmpfs tmpfs "$m/tmp"
ip link set lo up

# asroot CMD...: CMD as root in the Debian root, with a clean environment.
asroot() { chroot "$m" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
# alice CMD...: CMD as user alice (her groups: alice, vrdma), not root.
alice() {
  chroot "$m" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/home/alice USER=alice LANG=C.UTF-8 \
    VRDMA_SOCKET=/run/vrdma/vrdmad.sock setpriv --reuid=alice --regid=alice --init-groups --inh-caps=-all -- "$@"
}

echo "== dpkg -i"
mkdir "$m/tmp/debs"
cp "$DEBS"/*.deb "$m/tmp/debs/"
asroot sh -c 'dpkg -i /tmp/debs/vrdma_*.deb /tmp/debs/vrdma-dropin_*.deb /tmp/debs/vrdma-etcd_*.deb'
asroot dpkg -s vrdma vrdma-dropin vrdma-etcd | grep -E '^(Package|Status|Version):'
asroot vrdma-etcd --version
asroot getent group vrdma
asroot test -x /usr/bin/vrdmad -a -x /usr/bin/vrdmactl -a -f /usr/lib/vrdma/libibverbs.so.1 -a -f /usr/lib/vrdma/librdmacm.so.1
asroot test -s /usr/share/bash-completion/completions/vrdmactl -a -s /usr/share/zsh/vendor-completions/_vrdmactl -a -s /usr/share/fish/vendor_completions.d/vrdmactl.fish
asroot test -s /usr/share/man/man1/vrdmactl.1.gz -a -s /usr/share/man/man1/vrdmactl-perf.1.gz -a -s /usr/share/man/man8/vrdmad.8.gz
echo "man pages: $(asroot sh -c 'ls /usr/share/man/man1/vrdmactl*.1.gz | wc -l') vrdmactl, $(asroot sh -c 'zcat /usr/share/man/man8/vrdmad.8.gz | grep -c "^.TH \"VRDMAD\" \"8\""') vrdmad(8)"
asroot test ! -e /usr/bin/gcc # the workload host has no compiler: the drop-in is not built here
asroot useradd -m -G vrdma alice

echo "== vrdmad, as the installed unit starts it"
execstart=$(sed -n 's/^ExecStart=//p' "$m/lib/systemd/system/vrdmad.service")
VRDMAD_OPTS=
. "$m/etc/default/vrdmad"
line=${execstart//\$VRDMAD_OPTS/$VRDMAD_OPTS}
echo "ExecStart: $line"
mkdir -p "$m/run/vrdma" # the unit's RuntimeDirectory
# shellcheck disable=SC2086 # the unit's command line, split as systemd does
asroot $line >"$WORK/vrdmad.log" 2>&1 &
for i in $(seq 1 120); do
  asroot vrdmactl status >/dev/null 2>&1 && break
  [ "$i" = 120 ] && { echo "vrdmad did not answer in 60 s:"; cat "$WORK/vrdmad.log"; exit 1; }
  sleep 0.5
done

echo "== VMs for alice's group"
printf '%s\n' '.encoding = "UTF-8"' 'config.version = "8"' 'virtualHW.version = "20"' \
  'guestOS = "ubuntu-64"' 'memSize = "64"' \
  'ethernet0.present = "TRUE"' 'ethernet0.virtualDev = "vrdma"' >"$m/tmp/vm.vmx"
owner=$(asroot id -u alice):$(asroot getent group vrdma | cut -d: -f3)
asroot vrdmactl vm define vmA /tmp/vm.vmx --owner "$owner"
asroot vrdmactl vm define vmB /tmp/vm.vmx --owner "$owner"

echo "== as alice"
alice id
alice vrdmactl version
alice vrdmactl exec --vm vmA --no-view -- ibv_devinfo
alice env LD_LIBRARY_PATH=/usr/lib/vrdma VRDMA_VM=vmB ibv_devices
alice vrdmactl exec --vm vmA --no-view -- ibv_rc_pingpong -g 0 -p 18515 -n 200 >"$WORK/server.log" 2>&1 &
server=$!
for i in $(seq 1 50); do
  alice vrdmactl exec --vm vmB --no-view -- ibv_rc_pingpong -g 0 -p 18515 -n 200 127.0.0.1 && break
  [ "$i" = 50 ] && { echo "ibv_rc_pingpong client failed 50 times"; exit 1; }
  sleep 0.2
done
wait "$server" || { echo "ibv_rc_pingpong server failed:"; cat "$WORK/server.log"; exit 1; }
echo "server:"; cat "$WORK/server.log"
if [ -e "$m/home/alice/.cache/vrdma" ]; then
  echo "vrdmactl exec built a drop-in in ~/.cache/vrdma instead of using /usr/lib/vrdma"; exit 1
fi
echo "== agent log"; cat "$WORK/vrdmad.log"
echo "== all done"
