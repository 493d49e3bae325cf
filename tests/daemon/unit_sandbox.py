"""Run a command under the restrictions of a systemd unit's [Service] section, without
systemd (the test machines' PID 1 is not systemd), as systemd 252 applies them.

    /usr/bin/python3 unit_sandbox.py UNIT [--state-dir DIR] [--pids-cgroup DIR] [--kill] -- CMD...

Run as root inside the target network namespace (`ip netns exec`). Debian's python3 runs it
(python3-seccomp); it imports nothing from the project. Applied, in this order:
- mounts, in a mount (and with ProtectHostname a UTS) namespace of its own: ProtectSystem=strict
  (everything read-only but /proc, /sys, /dev and the StateDirectory, which is DIR here),
  ProtectHome, ProtectProc/ProcSubset (a new /proc), ProtectKernelTunables/Logs,
  DevicePolicy=closed with DeviceAllow (a /dev holding only those devices: with no device
  cgroup here, what is not there cannot be opened);
- TasksMax as pids.max of a v1 pids cgroup DIR that the caller made (and removes);
- UMask, NoNewPrivileges, CapabilityBoundingSet (root's capabilities after exec are the
  bounding set);
- MemoryDenyWriteExecute both ways systemd has done it: prctl(PR_SET_MDWE) and seccomp;
- seccomp filters like systemd's: SystemCallFilter (sets expanded by `systemd-analyze
  syscall-filter`), SystemCallErrorNumber (--kill: kill instead, so that no refused call can
  go unnoticed), SystemCallArchitectures=native, RestrictAddressFamilies, RestrictNamespaces,
  RestrictRealtime, RestrictSUIDSGID, LockPersonality.
A key it does not know is refused, so a new unit option is either applied or listed in
NOT_APPLIED with the reason."""

import argparse
import ctypes
import errno
import os
import socket
import subprocess
import sys
import tempfile

import seccomp

NOT_APPLIED = {
    # service management, not restrictions
    "Type", "NotifyAccess", "ExecStart", "ExecReload", "Restart", "RestartSec", "WatchdogSec",
    "TimeoutStopSec",
    "PrivateTmp",  # the tests' files live in /tmp
    "IPAddressDeny",  # a cgroup BPF program of systemd's
    "MemoryMax",  # the test machine's memory cgroup is not ours to change
    "ProtectKernelModules",  # the capability (CAP_SYS_MODULE) and @module are gone anyway
    "ProtectControlGroups",  # `ip netns exec` mounts a /sys without cgroup file systems
    "ProtectClock",  # @clock is outside @system-service; no rtc in the /dev made here
}

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
PROT_WRITE, PROT_EXEC, SHM_EXEC = 2, 4, 0o100000
S_ISUID, S_ISGID, O_CREAT = 0o4000, 0o2000, 0o100
SCHED_FIFO, SCHED_RR, SCHED_DEADLINE, SCHED_RESET_ON_FORK = 1, 2, 6, 0x40000000
AF_MAX = 46
CLOSED_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")  # DevicePolicy=closed
CAPS = {"CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13, "CAP_BPF": 39}

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source, target: str, fstype, flags: int, data=None) -> None:
    enc = lambda s: s.encode() if s is not None else None
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def prctl(*args: int) -> None:
    _check(libc.prctl(*(ctypes.c_ulong(a) for a in args)), f"prctl {args[0]}")


def read_service(path: str) -> dict[str, list[str]]:
    """[Service] keys -> their values in order (a key may repeat)."""
    settings: dict[str, list[str]] = {}
    section = None
    for line in open(path):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def last(settings, key, default=""):
    return settings.get(key, [default])[-1]


def yes(settings, key) -> bool:
    return last(settings, key, "no") in ("yes", "true", "1", "on")


# --- mounts ---------------------------------------------------------------------------

def mount_points() -> list[tuple[str, int]]:
    """(mount point, its nosuid/nodev/noexec flags) from /proc/self/mountinfo."""
    result = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        options = fields[5].split(",")
        flags = sum(f for name, f in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC))
                    if name in options)
        result.append((point, flags))
    return result


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def read_only(point: str, flags: int = 0) -> None:
    mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def protect_system(writable: list[str]) -> None:
    """ProtectSystem=strict: every mount read-only except the API file systems and `writable`."""
    for path in writable:
        mount(path, path, None, MS_BIND)
    for point, flags in mount_points():
        if any(under(point, top) for top in ("/proc", "/sys", "/dev", *writable)):
            continue
        read_only(point, flags)


def protect_home(mode: str) -> None:
    for top in ("/root", "/home", "/run/user"):
        if not os.path.isdir(top):
            continue
        if mode in ("yes", "tmpfs"):  # systemd: inaccessible, or an empty tmpfs
            mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV | (MS_RDONLY if mode == "yes" else 0),
                  "mode=000" if mode == "yes" else "mode=755")
        elif mode == "read-only":
            mount(top, top, None, MS_BIND | MS_REC)
            read_only(top)


def protect_proc(settings) -> None:
    """ProtectProc=/ProcSubset=: a new /proc with hidepid= and subset=."""
    options = []
    if last(settings, "ProtectProc", "default") != "default":
        options.append(f"hidepid={last(settings, 'ProtectProc')}")
    if last(settings, "ProcSubset", "all") == "pid":
        options.append("subset=pid")
    if options:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, ",".join(options))


def protect_kernel(settings) -> None:
    if yes(settings, "ProtectKernelTunables"):
        for path in ("/proc/sys", "/proc/sysrq-trigger", "/sys"):
            if os.path.exists(path):
                mount(path, path, None, MS_BIND)
                read_only(path)
    if yes(settings, "ProtectKernelLogs") and os.path.exists("/proc/kmsg"):
        mount("/dev/null", "/proc/kmsg", None, MS_BIND)
        read_only("/proc/kmsg")


def private_dev(settings) -> None:
    """DevicePolicy=closed + DeviceAllow=: a /dev with the standard pseudo devices and the
    allowed nodes bound in (read-only where only "r" is allowed)."""
    allowed = {"/dev/" + name: "rw" for name in CLOSED_DEVICES}
    for entry in settings.get("DeviceAllow", []):
        path, _, access = entry.partition(" ")
        if path.startswith("/dev/"):
            allowed[path] = access or "rwm"
    old = os.open("/dev", os.O_PATH | os.O_DIRECTORY)
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=755")
    for path, access in allowed.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        mount(f"/proc/self/fd/{old}/{path[len('/dev/'):]}", path, None, MS_BIND)
        if "w" not in access:
            read_only(path)
    os.close(old)
    os.mkdir("/dev/shm", 0o1777)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    os.symlink("/proc/self/fd", "/dev/fd")
    for n, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{n}", f"/dev/{name}")


def apply_mounts(settings, state_dir: str | None) -> None:
    flags = CLONE_NEWNS | (CLONE_NEWUTS if yes(settings, "ProtectHostname") else 0)
    _check(libc.unshare(flags), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    writable = []
    if settings.get("StateDirectory"):
        if state_dir is None:
            raise SystemExit("unit_sandbox: the unit has a StateDirectory: give --state-dir")
        os.makedirs(state_dir, mode=int(last(settings, "StateDirectoryMode", "0755"), 8), exist_ok=True)
        writable.append(state_dir)
    mode = last(settings, "ProtectSystem", "no")
    if mode != "strict":
        raise SystemExit(f"unit_sandbox: ProtectSystem={mode} is not supported (only strict)")
    protect_home(last(settings, "ProtectHome", "no"))
    protect_system(writable)
    if last(settings, "DevicePolicy", "auto") == "closed":
        private_dev(settings)
    elif "DeviceAllow" in settings:
        raise SystemExit("unit_sandbox: DeviceAllow= without DevicePolicy=closed is not supported")
    protect_proc(settings)
    protect_kernel(settings)


# --- process attributes ------------------------------------------------------------------

def join_pids_cgroup(settings, cgroup: str | None) -> None:
    """TasksMax: the caller's v1 pids cgroup, mounted here (`ip netns exec` hides /sys/fs/cgroup)."""
    if cgroup is None or "TasksMax" not in settings:
        return
    top = tempfile.mkdtemp(prefix="unit-sandbox-pids-")
    mount("cgroup", top, "cgroup", MS_NOSUID | MS_NODEV | MS_NOEXEC, "pids")
    try:
        path = os.path.join(top, cgroup.lstrip("/"))
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(last(settings, "TasksMax"))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    finally:
        libc.umount2(top.encode(), 2)  # MNT_DETACH
        os.rmdir(top)


def drop_privileges(settings) -> None:
    if last(settings, "User", "root") != "root":
        raise SystemExit("unit_sandbox: only User=root is supported")
    os.umask(int(last(settings, "UMask", "0022"), 8))
    keep = set()
    for value in settings.get("CapabilityBoundingSet", []):
        keep |= {CAPS[name] for name in value.split()}
    if "CapabilityBoundingSet" in settings:
        last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
        for cap in range(last_cap + 1):
            if cap not in keep:
                prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if yes(settings, "NoNewPrivileges"):
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if yes(settings, "MemoryDenyWriteExecute"):
        try:
            prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)
        except OSError as exc:  # before Linux 6.3: the seccomp rules alone, as systemd 252 has them
            if exc.errno != errno.EINVAL:
                raise


# --- seccomp -----------------------------------------------------------------------------

def expand(name: str) -> set[str]:
    """A syscall or a @set, as systemd itself lists the set."""
    if not name.startswith("@"):
        return {name}
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], check=True, capture_output=True,
                         text=True).stdout
    calls = set()
    for line in out.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            calls |= expand(line)
    return calls


def allowed_syscalls(settings) -> set[str] | None:
    allowed = None
    for value in settings.get("SystemCallFilter", []):
        deny = value.startswith("~")
        names = set().union(*(expand(n) for n in value.lstrip("~").split()))
        if allowed is None:
            if deny:
                raise SystemExit("unit_sandbox: a deny-list SystemCallFilter first is not supported")
            allowed = names
        else:
            allowed = allowed - names if deny else allowed | names
    return allowed


def errno_number(settings) -> int:
    name = last(settings, "SystemCallErrorNumber", "")
    return getattr(errno, name) if name else 0


def syscall_filter(settings, kill: bool):
    allowed = allowed_syscalls(settings)
    if allowed is None:
        return None
    number = errno_number(settings)
    refuse = seccomp.KILL_PROCESS if kill or not number else seccomp.ERRNO(number)
    f = seccomp.SyscallFilter(refuse)
    for call in sorted(allowed):
        try:
            f.add_rule(seccomp.ALLOW, call)
        except RuntimeError:  # newer than this libseccomp (uretprobe, riscv_hwprobe): stays refused
            pass
    return f


def masked(arg: int, bits: int):
    return seccomp.Arg(arg, seccomp.MASKED_EQ, bits, bits)


def restriction_filters(settings) -> list:
    """One filter per option, each allowing everything else (as systemd loads them)."""
    filters = []

    def new():
        f = seccomp.SyscallFilter(seccomp.ALLOW)
        filters.append(f)
        return f

    families = last(settings, "RestrictAddressFamilies", "")
    if families:
        keep = {getattr(socket, name) for name in families.split()}
        f = new()
        for family in range(AF_MAX):
            if family not in keep:
                f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, family))
        f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.GE, AF_MAX))
    if yes(settings, "RestrictNamespaces"):
        f = new()
        f.add_rule(seccomp.ERRNO(errno.EPERM), "setns")
        f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # flags in a struct: glibc falls back to clone
        for flag in NAMESPACE_FLAGS:
            f.add_rule(seccomp.ERRNO(errno.EPERM), "unshare", masked(0, flag))
            f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", masked(0, flag))
    if yes(settings, "MemoryDenyWriteExecute"):
        f = new()
        f.add_rule(seccomp.ERRNO(errno.EPERM), "mmap", masked(2, PROT_WRITE | PROT_EXEC))
        f.add_rule(seccomp.ERRNO(errno.EPERM), "mprotect", masked(2, PROT_EXEC))
        f.add_rule(seccomp.ERRNO(errno.EPERM), "pkey_mprotect", masked(2, PROT_EXEC))
        f.add_rule(seccomp.ERRNO(errno.EPERM), "shmat", masked(2, SHM_EXEC))
    if yes(settings, "RestrictRealtime"):
        f = new()
        for policy in (SCHED_FIFO, SCHED_RR, SCHED_DEADLINE):
            for variant in (policy, policy | SCHED_RESET_ON_FORK):
                f.add_rule(seccomp.ERRNO(errno.EPERM), "sched_setscheduler", seccomp.Arg(1, seccomp.EQ, variant))
    if yes(settings, "RestrictSUIDSGID"):
        f = new()
        for call, mode_arg in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("mkdir", 1), ("mkdirat", 2),
                               ("mknod", 1), ("mknodat", 2), ("creat", 1)):
            for bit in (S_ISUID, S_ISGID):
                f.add_rule(seccomp.ERRNO(errno.EPERM), call, masked(mode_arg, bit))
        for call, flags_arg in (("open", 1), ("openat", 2)):
            for bit in (S_ISUID, S_ISGID):
                f.add_rule(seccomp.ERRNO(errno.EPERM), call, masked(flags_arg, O_CREAT), masked(flags_arg + 1, bit))
    if yes(settings, "LockPersonality"):
        f = new()
        f.add_rule(seccomp.ERRNO(errno.EPERM), "personality", seccomp.Arg(0, seccomp.NE, 0))  # PER_LINUX only
    return filters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("unit")
    p.add_argument("--state-dir", help="where the StateDirectory is in this run")
    p.add_argument("--pids-cgroup", help="a v1 pids cgroup (path below the hierarchy) for TasksMax")
    p.add_argument("--kill", action="store_true", help="kill on a call outside SystemCallFilter")
    if "--" not in sys.argv:
        p.error("give the command after --")
    split = sys.argv.index("--")
    args, command = p.parse_args(sys.argv[1:split]), sys.argv[split + 1:]
    settings = read_service(args.unit)
    applied = {"User", "CapabilityBoundingSet", "NoNewPrivileges", "ProtectSystem", "ProtectHome",
               "PrivateMounts", "StateDirectory", "StateDirectoryMode", "UMask", "ProtectProc", "ProcSubset",
               "DevicePolicy", "DeviceAllow", "ProtectKernelTunables", "ProtectKernelLogs", "ProtectHostname",
               "RestrictAddressFamilies", "RestrictNamespaces", "RestrictSUIDSGID", "RestrictRealtime",
               "LockPersonality", "MemoryDenyWriteExecute", "SystemCallArchitectures", "SystemCallFilter",
               "SystemCallErrorNumber", "TasksMax"}
    unknown = sorted(set(settings) - applied - NOT_APPLIED)
    if unknown:
        raise SystemExit(f"unit_sandbox: does not know how to apply {', '.join(unknown)}")
    if last(settings, "SystemCallArchitectures", "native") != "native":
        raise SystemExit("unit_sandbox: only SystemCallArchitectures=native is supported")
    main_filter = syscall_filter(settings, args.kill)  # systemd-analyze runs before the mounts
    restrictions = restriction_filters(settings)
    join_pids_cgroup(settings, args.pids_cgroup)
    drop_privileges(settings)  # the bounding set: this process keeps its capabilities until exec
    apply_mounts(settings, args.state_dir)
    for f in restrictions + ([main_filter] if main_filter else []):
        f.load()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
