"""The worker container's seccomp profile (deploy/seccomp/worker.json): default-deny, nsjail's
system calls allowed, the kernel-reaching ones that neither nsjail nor a jailed program needs not.

The profile is in the flat OCI form (`names`, no `includes`/`excludes` conditions), which Docker,
podman, containerd and CRI-O all read. It is the outer filter: the jail's own policy
(sandbox_service/jail/policy.py) further narrows what jailed programs may call.
"""

from __future__ import annotations

import json
from pathlib import Path

PROFILE = Path("deploy/seccomp/worker.json")
"""Relative to the repository root (compose runs from there)."""
K8S_LOCALHOST_PROFILE = "rl-sandbox/worker.json"
"""Its path under the kubelet's seccomp directory (/var/lib/kubelet/seccomp) on every node."""

NSJAIL_NEEDS = frozenset(
    {
        "clone", "clone3", "unshare", "mount", "umount2", "pivot_root", "sethostname",
        "setresuid", "setresgid", "setgroups", "capset", "capget", "prctl", "seccomp",
        "execve", "wait4", "setrlimit", "prlimit64", "socket", "sendmsg", "recvmsg",
        "mkdirat", "openat", "fchmodat", "ioctl", "kill",
    }
)  # fmt: skip
"""What nsjail calls to build a jail (namespaces, mounts, uid maps, loopback over netlink)."""

NEVER = frozenset(
    {
        "bpf", "perf_event_open", "kexec_load", "kexec_file_load", "init_module",
        "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at", "ptrace",
        "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "reboot",
        "swapon", "swapoff", "syslog", "userfaultfd", "iopl", "ioperm", "acct",
        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "chroot", "quotactl",
        "lookup_dcookie", "fanotify_init", "move_mount", "open_tree", "fsopen", "fsmount",
    }
)  # fmt: skip
"""Reach into the host kernel or other processes, and neither nsjail nor a program needs them."""

ARCHITECTURES = frozenset({"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"})
"""Native 64-bit only: 32-bit compat system calls are a separate, unfiltered-by-name surface."""


def check(path: Path) -> list[str]:
    """Problems with the worker's seccomp profile."""
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{path}: {exc}"]
    out: list[str] = []
    if profile.get("defaultAction") not in ("SCMP_ACT_ERRNO", "SCMP_ACT_KILL_PROCESS"):
        out.append(f"{path}: defaultAction must deny (SCMP_ACT_ERRNO), not allow or log")
    if set(profile.get("architectures") or []) != ARCHITECTURES:
        out.append(f"{path}: architectures must be exactly {sorted(ARCHITECTURES)}")
    allowed: set[str] = set()
    for rule in profile.get("syscalls") or []:
        if set(rule) - {"names", "action", "args", "errnoRet", "comment"}:
            out.append(f"{path}: rule keys {sorted(rule)}: use the flat OCI form only")
        if rule.get("action") == "SCMP_ACT_ALLOW":
            allowed.update(rule.get("names") or [])
    if missing := sorted(NSJAIL_NEEDS - allowed):
        out.append(f"{path}: nsjail needs {missing}")
    if extra := sorted(NEVER & allowed):
        out.append(f"{path}: allows {extra}, which nothing in the worker needs")
    return out
