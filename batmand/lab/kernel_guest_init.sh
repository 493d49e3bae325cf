#!/bin/sh
# /init of a netns-lab kernel node: busybox sh as PID 1 in the initramfs that
# batmand/lab/kernel_image.py builds. It loads batman-adv, makes bat0 from the NICs the
# host gave the VM, and then serves the host's command channel on /dev/ttyS1.
#
# Kernel command line (written by batmand/lab/kernel_node.py):
#   bm.conf=BASE64   a shell fragment, sourced:
#                      NODE           host name
#                      ALGO           BATMAN_IV or BATMAN_V (batctl ra, before bat0 exists)
#                      NICS           "MAC/MTU MAC/MTU ...": the NICs, in hard-interface order
#                      MESH_MAC       bat0's MAC
#                      MESH_SETTINGS  lines "SETTING VALUE" for `batctl meshif bat0`, applied
#                                     before bat0 goes up (bridge_loop_avoidance 0, orig_interval ..)
#                      HARDIF_SETTINGS lines "NIC-INDEX SETTING VALUE" for `batctl hardif`
#                                     (throughput_override, elp_interval, hop_penalty)
#                      LAN_NIC        "MAC/MTU" of a NIC that is no mesh interface but is
#                                     bridged with bat0: br0 = bat0 + it (optional; then
#                                     ADDR4 goes on br0, and bat0, br0, the NIC have IPv6 off)
#                      ADDR4, ADDR6   addresses on bat0 (optional)
#                      SETUP          shell commands run once bat0 is up (optional)
#   bm.probe         print BM-PROBE-OK and power off (the accelerator probe)
#
# Console (ttyS0): progress lines "bm-init: ..." and, when done,
#   BM-READY uptime=SECONDS problems=N
#
# Channel (ttyS1, raw): one request per line, one answer per request:
#   RUN ID SECONDS SCRIPT_BASE64 [STDIN_BASE64|-]
#   @@ID got (at once) / @@ID out / base64 of stdout / @@ID err / base64 of stderr /
#   @@ID end STATUS [timeout]
# The script runs under `sh` with a time limit; ID is the host's, to tell answers apart.
# A request the host sends again (no "got" seen) is acknowledged but not run twice.

export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/bm

problems=0
note() { read -r up _ < /proc/uptime; echo "bm-init: [$up] $*"; }
problem() { echo "bm-init: PROBLEM: $*"; problems=$((problems + 1)); }
centis() { read -r up _ < /proc/uptime; echo $(( ${up%.*} * 100 + 1${up#*.} - 100 )); }

for word in $(cat /proc/cmdline); do
    case "$word" in
        bm.probe) echo "BM-PROBE-OK"; poweroff -f ;;
        bm.conf=*) echo "${word#bm.conf=}" | base64 -d > /etc/bm/node.conf || problem "cannot decode bm.conf" ;;
    esac
done
. /etc/bm/image
[ -f /etc/bm/node.conf ] && . /etc/bm/node.conf
hostname "${NODE:-kernel-node}"
note "$NODE: kernel $KERNEL_RELEASE, batman-adv $VERSION_BATMAN_ADV, batctl $VERSION_BATCTL, $ALGO"

# Interfaces created from now on do no duplicate address detection and send no router
# solicitations; the hard interfaces get IPv6 switched off altogether below.
for scope in default all; do
    echo 0 > /proc/sys/net/ipv6/conf/$scope/accept_dad
    echo 0 > /proc/sys/net/ipv6/conf/$scope/router_solicitations
done
echo /sbin/modprobe > /proc/sys/kernel/modprobe

# modules in dependency order; a leading "?" marks an optional one (a soft dependency such
# as crc32c-intel, which needs SSE4.2 that TCG's default CPU does not have)
while read -r entry; do
    ko=${entry#\?}
    out=$(insmod "/lib/modules/$KERNEL_RELEASE/$ko" 2>&1) && continue
    case "$out" in *"File exists"*) continue ;; esac
    [ "$entry" = "$ko" ] && problem "insmod $ko: $out"
done < /etc/bm/modules
[ -d /sys/module/batman_adv ] || problem "batman-adv is not loaded"
note "modules loaded"
ip link set lo up

nic_with_mac() {
    for dir in /sys/class/net/*; do
        [ "$(cat "$dir/address")" = "$1" ] && { echo "${dir##*/}"; return 0; }
    done
    return 1
}

# the NIC with this MAC (virtio may still be probing it: wait up to 5 s), or nothing
wait_nic() {
    tries=0
    while ! nic_with_mac "$1"; do
        tries=$((tries + 1))
        [ $tries -gt 100 ] && return 1
        sleep 0.05
    done
}

no_ipv6() { echo 1 > /proc/sys/net/ipv6/conf/$1/disable_ipv6 || problem "IPv6 off on $1"; }

batctl routing_algo "${ALGO:-BATMAN_IV}" > /dev/null || problem "batctl routing_algo $ALGO"
index=0
for nic in $NICS; do
    mac=${nic%/*}
    mtu=${nic#*/}
    dev=$(wait_nic "$mac")
    index=$((index + 1))
    if [ -z "$dev" ]; then
        problem "no NIC with MAC $mac"
        continue
    fi
    eval "NIC_DEV_$((index - 1))=$dev"
    echo 1 > /proc/sys/net/ipv6/conf/$dev/disable_ipv6
    ip link set "$dev" mtu "$mtu" || problem "MTU $mtu on $dev"
    batctl meshif bat0 interface add "$dev" > /dev/null || problem "batctl meshif bat0 interface add $dev"
    ip link set "$dev" up || problem "$dev up"
done

note "NICs added"
if [ -d /sys/class/net/bat0 ]; then
    [ -n "$MESH_MAC" ] && { ip link set bat0 address "$MESH_MAC" || problem "bat0 address $MESH_MAC"; }
    while read -r setting; do
        [ -n "$setting" ] || continue
        batctl meshif bat0 $setting > /dev/null || problem "batctl meshif bat0 $setting"
    done <<EOF
$MESH_SETTINGS
EOF
    while read -r nic_index setting value; do
        [ -n "$setting" ] || continue
        eval "dev=\$NIC_DEV_$nic_index"
        batctl hardif "$dev" "$setting" "$value" > /dev/null || problem "batctl hardif $dev $setting $value"
    done <<EOF
$HARDIF_SETTINGS
EOF
    addr_dev=bat0
    if [ -n "$LAN_NIC" ]; then  # br0 = bat0 + the LAN NIC, all three without IPv6
        no_ipv6 bat0
        if lan_dev=$(wait_nic "${LAN_NIC%/*}"); then
            no_ipv6 "$lan_dev"
            ip link set "$lan_dev" mtu "${LAN_NIC#*/}" || problem "MTU ${LAN_NIC#*/} on $lan_dev"
            brctl addbr br0 || problem "brctl addbr br0"
            no_ipv6 br0
            for knob in stp_state=0 forward_delay=0 multicast_snooping=0; do
                echo "${knob#*=}" > /sys/class/net/br0/bridge/${knob%=*} || problem "br0 $knob"
            done
            brctl addif br0 bat0 && brctl addif br0 "$lan_dev" || problem "br0's ports"
            ip link set "$lan_dev" up || problem "$lan_dev up"
            addr_dev=br0
            note "LAN: br0 = bat0 + $lan_dev"
        else
            problem "no LAN NIC with MAC ${LAN_NIC%/*}"
        fi
    fi
    ip link set bat0 up || problem "bat0 up"
    [ "$addr_dev" = br0 ] && { ip link set br0 up || problem "br0 up"; }
    [ -n "$ADDR4" ] && { ip addr add "$ADDR4" dev $addr_dev || problem "address $ADDR4"; }
    [ -n "$ADDR6" ] && { ip -6 addr add "$ADDR6" dev $addr_dev || problem "address $ADDR6"; }
else
    problem "no bat0"
fi
if [ -n "$SETUP" ]; then
    sh -c "$SETUP" > /run/bm/setup.log 2>&1 || problem "setup commands failed: $(tail -n 3 /run/bm/setup.log)"
fi
# the channel in raw mode before the host may use it: no echo, no line editing, no CR/LF mangling
[ -c /dev/ttyS1 ] && stty -F /dev/ttyS1 raw -echo
read -r up _ < /proc/uptime
echo "BM-READY uptime=$up problems=$problems"

serve() {
    last=""
    while IFS= read -r request; do
        set -- $request
        if [ "$1" != RUN ] || [ $# -lt 4 ]; then
            [ -n "$request" ] && note "channel: ignored a line of ${#request} bytes" > /dev/console
            continue
        fi
        id=$2
        limit=$3
        echo "@@$id got"
        [ "$id" = "$last" ] && continue  # the host sent it again before it saw our "got"
        last=$id
        job=/run/bm/req.$id
        echo "$4" | base64 -d > $job.sh 2> /dev/null
        if [ "${5:--}" = - ]; then
            : > $job.in
        else
            echo "$5" | base64 -d > $job.in 2> /dev/null
        fi
        begin=$(centis)
        timeout "$limit" sh $job.sh < $job.in > $job.out 2> $job.err
        status=$?
        late=""
        if [ $status -ge 128 ] && [ $(( $(centis) - begin )) -ge $(( limit * 100 - 5 )) ]; then
            late=" timeout"
        fi
        echo "@@$id out"
        base64 $job.out
        echo "@@$id err"
        base64 $job.err
        echo "@@$id end $status$late"
        rm -f $job.sh $job.in $job.out $job.err
    done < /dev/ttyS1 > /dev/ttyS1
    note "channel: reading /dev/ttyS1 failed, serving again" > /dev/console
}

if [ -c /dev/ttyS1 ]; then
    while true; do
        serve
        sleep 1
    done
fi
problem "no /dev/ttyS1: no command channel"
while true; do sleep 3600; done
