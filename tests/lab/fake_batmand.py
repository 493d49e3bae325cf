"""A stand-in for batmand in lab tests: takes batmand's command line, checks its hard
interfaces exist, creates the soft interface (a TAP, as batmand does) and the control
socket, and removes both on SIGTERM (or, with --ignore-term, has to be killed)."""

import argparse
import os
import signal
import socket
import sys
import time

import pytun

p = argparse.ArgumentParser()
p.add_argument("-m", "--meshif", default="bat0")
p.add_argument("-i", "--interface", action="append", default=[])
p.add_argument("--config")
p.add_argument("--control-socket", default="@batmand/bat0")  # batmand's default: abstract
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--fail", action="store_true")
args = p.parse_args()
print("fake batmand:", " ".join(sys.argv[1:]), flush=True)
if args.fail:
    print("fake batmand: failing as asked", flush=True)
    sys.exit(3)
for ifname in args.interface:
    if not os.path.exists(f"/sys/class/net/{ifname}"):
        print(f"fake batmand: no interface {ifname}", flush=True)
        sys.exit(2)
with open(args.config) as f:
    print("config:", f.read().strip().replace("\n", "; "), flush=True)
tap = pytun.TunTapDevice(name=args.meshif, flags=pytun.IFF_TAP | pytun.IFF_NO_PI)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
abstract = args.control_socket.startswith("@")
sock.bind("\0" + args.control_socket[1:] if abstract else args.control_socket)
sock.listen()


def stop(*_):
    tap.close()  # the TAP is not persistent: it goes with its last fd
    if not abstract:
        os.unlink(args.control_socket)
    print("fake batmand: stopped", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else stop)
while True:
    time.sleep(1)
