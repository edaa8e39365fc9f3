"""The jail policy: a pure function from a JailLayout to an nsjail configuration.

Units follow nsjail's own: `rlimit_*` in MiB or plain counts, `time_limit` in seconds (0 = none;
nsjail's default is 600, so it is always set here). Memory and process limits are not nsjail's
cgroup options: the worker puts the zygote in cgroups of its own (see cgroups.py), so that the
limits cover each execution rather than the jail's whole life.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from nsjail import Exe, IdMap, MountPt, NsJailConfig
from nsjail.enums import Mode, RLimitType

from sandbox_service.import_scan import Zygote
from sandbox_service.jail.inside.protocol import MEMBERS_DIR_IN_JAIL

JAILED_UID = 1000
"""The program's uid (and gid) inside the jail; it owns nothing of the jail's machinery."""
ZYGOTE_UID = 0
"""The zygote's uid inside the jail (root of the jail's user namespace only): it owns the
control channel, PID 1's /proc files and the scratch roots' parents, and keeps the few
capabilities of ZYGOTE_CAPS over that namespace alone. The program is a different principal,
so the kernel refuses it every call that the same uid would allow on PID 1 (kill, renice,
affinity, ptrace-like access, /proc/1)."""
ZYGOTE_UID_SHIFT = 100_000
"""The zygote's outside uid is the program's plus this: two unprivileged host uids per jail."""
ZYGOTE_CAPS = (
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_KILL",
    "CAP_SYS_ADMIN",
    "CAP_DAC_READ_SEARCH",
    "CAP_NET_ADMIN",
)
"""Over the jail's own user namespace only: to make each run's process the program's uid, to
kill the program's processes, to mount each run's fresh scratch tmpfs (and make a fresh network
namespace after a run that used one), to read the files it fetches for the answer (a program may
make them unreadable), and to bring a fresh namespace's loopback up (inside/netns.py). A
process that becomes JAILED_UID loses every capability (the kernel clears them on leaving
uid 0)."""
INSIDE_DIR_IN_JAIL = "/opt/rl-sandbox/inside"
"""The in-jail program's package (jail/inside/), mounted read-only."""
ZYGOTE_PATH_IN_JAIL = f"{INSIDE_DIR_IN_JAIL}/__main__.py"
"""Started as a script, which loads its directory as a package by path (nothing on sys.path)."""
WORK_DIR = "/home/sandbox"
E2B_WORK_DIR = "/home/user"
"""A link to WORK_DIR: the E2B SDK's code and files share /home/user."""
SCRATCH_DIRS = (WORK_DIR, "/tmp", "/mnt", "/dev/shm")
"""The jail's private writable directories (tmpfs); /mnt because SandboxFusion's programs use it."""
MS_NOSUID_NODEV = 2 | 4
"""The flags of every scratch mount (the zygote's mount(2) calls; seccomp lets no others by)."""
MNT_DETACH = 2
CLONE_NEWNET = 0x40000000
"""The one namespace the zygote makes: a fresh network namespace after a run used its own."""
MS_MOVE = 8192
"""The flag of the zygote's moves of a session member's scratch mounts (inside/scratch.py)."""
MEMBERS_DIR_OPTIONS = f"size=1m,nr_inodes={8 * 4096},mode=0700,uid={ZYGOTE_UID},gid={ZYGOTE_UID}"
"""The zygote's holding place of session members' scratch mounts: directories only (five per
member, MAX_MEMBERS of them), reachable by the zygote's uid alone."""
HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
"""/etc/hosts: `localhost` (and the jail's hostname) on the loopback interface nsjail brings up."""
NSSWITCH = b"hosts: files\n"
"""Names resolve from /etc/hosts only: there is no DNS server to ask, and glibc's default without
this file would try one first."""
VENV_IN_JAIL = "/opt/rl-sandbox/venv"
MATPLOTLIB_CACHE_IN_JAIL = "/opt/rl-sandbox/matplotlib"
"""matplotlib's font list, built once on the host (matplotlib_cache.py), mounted read-only."""
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
TOOLCHAIN_CONFIG_GLOBS = ("/etc/java-*-openjdk",)
"""The JDK's configuration (Debian links its conf/ and security files there): mounted read-only
where present, so that java and javac start in the jail (jail/languages.py)."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


# Default deny: the calls CPython, numpy, scipy, sympy, matplotlib (Agg), multiprocessing,
# threads, subprocesses of the interpreter and loopback sockets make (found with strace -f of
# such programs in the jail, docs/security.md), plus their close relatives (the *at, v and 64
# forms, the legacy x86-64 names). Everything else fails with an errno, never a kill, so that the
# program gets an ordinary Python exception and the jail keeps serving:
# - the calls that leave or widen a jail, or reach into the kernel, answer EPERM;
# - clone3 and io_uring answer ENOSYS (libc falls back to clone, whose namespace flags seccomp
#   can see; io_uring would bypass seccomp), and so do SysV IPC and POSIX message queues (no IPC
#   object may outlive a run);
# - any other call answers ENOSYS, as a kernel without it would: libc and runtimes fall back on
#   ENOSYS (and only on it) to older calls that are allowed.
def _calls(names: str) -> tuple[str, ...]:
    return tuple(names.split())


SECCOMP_DENIED_EPERM = _calls(
    "ptrace process_vm_readv process_vm_writev kcmp pidfd_getfd "
    "pivot_root chroot move_mount open_tree fsopen fsconfig fsmount fspick "
    "mount_setattr setns "
    "bpf perf_event_open userfaultfd keyctl add_key request_key "
    "kexec_load kexec_file_load init_module finit_module delete_module "
    "reboot swapon swapoff acct quotactl quotactl_fd "
    "settimeofday clock_settime clock_adjtime adjtimex sethostname setdomainname "
    "syslog lookup_dcookie open_by_handle_at name_to_handle_at fanotify_init "
    "iopl ioperm vhangup personality "
    "setuid setgid setreuid setregid setfsuid setfsgid capset"
)
SECCOMP_DENIED_ENOSYS = _calls(
    "clone3 io_uring_setup io_uring_enter io_uring_register "
    "msgget msgsnd msgrcv msgctl shmget shmat shmdt shmctl semget semop semtimedop semctl "
    "mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr"
)
SECCOMP_ALLOWED = _calls(
    # files and descriptors
    "read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 "
    "open openat openat2 creat close close_range lseek dup dup2 dup3 fcntl flock ioctl "
    "newstat newfstat newlstat newfstatat statx statfs fstatfs "
    "access faccessat faccessat2 readlink readlinkat getdents getdents64 "
    "mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 "
    "link linkat symlink symlinkat mknod mknodat "
    "chmod fchmod fchmodat chown fchown lchown fchownat "
    "truncate ftruncate fsync fdatasync sync_file_range fallocate fadvise64 readahead "
    "utime utimes utimensat futimesat chdir fchdir getcwd umask "
    "pipe pipe2 sendfile64 copy_file_range splice tee memfd_create "
    "getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr "
    "setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr "
    # memory
    "brk mmap munmap mprotect mremap madvise msync mincore "
    "mbind get_mempolicy set_mempolicy membarrier "
    # processes and threads
    "clone fork vfork execve execveat exit exit_group wait4 waitid "
    "kill tkill tgkill pidfd_open pidfd_send_signal "
    "getpid getppid gettid getuid geteuid getgid getegid getresuid getresgid getgroups capget "
    "setsid setpgid getpgid getpgrp getsid prctl arch_prctl "
    "set_tid_address set_robust_list rseq futex futex_waitv "
    "sched_yield sched_getaffinity sched_setaffinity sched_getparam sched_getscheduler "
    "sched_get_priority_max sched_get_priority_min sched_rr_get_interval "
    "getpriority setpriority getrlimit setrlimit prlimit64 getrusage "
    # time and signals
    "nanosleep clock_nanosleep clock_gettime clock_getres gettimeofday time times "
    "sysinfo newuname getcpu getrandom restart_syscall "
    "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait rt_sigsuspend "
    "rt_sigqueueinfo rt_tgsigqueueinfo sigaltstack pause alarm setitimer getitimer "
    "timer_create timer_settime timer_gettime timer_getoverrun timer_delete "
    "timerfd_create timerfd_settime timerfd_gettime signalfd signalfd4 eventfd eventfd2 "
    # waiting
    "select pselect6 poll ppoll epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait "
    "epoll_pwait2 "
    # sockets (the network namespace holds only loopback)
    "socketpair bind listen accept accept4 connect getsockname getpeername "
    "sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg shutdown setsockopt getsockopt"
)
_CLONE_NEW_ANY = 0x7E020080
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME."""
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
"""Socket families a program may open; netlink only as NETLINK_ROUTE (0), for the interface
list (socket.if_nameindex): packet, vsock, bluetooth, the other netlink families... are the
kernel's attack surface and nothing a program here needs."""
_AF_NETLINK = 16
INET_SOCKET_TYPES = {"SOCK_STREAM": 1}
"""Socket types a program may open in AF_INET and AF_INET6: TCP only. A datagram socket's
receive queue (UDP, ICMP echo) is kernel memory that cgroup v1 charges to no cgroup: unread
loopback datagrams held hundreds of MiB of host memory past a 128 MiB run (measured). Unix
sockets of every type stay allowed (their buffers are charged to the run)."""
_SOCK_TYPE_MASK = 0xF
_ESOCKTNOSUPPORT = 94
_EPROTONOSUPPORT = 93
INET_PROTOCOLS = {"default": 0, "IPPROTO_TCP": 6}
"""Protocols a program may name for an inet stream socket: IPPROTO_SCTP (132) and
IPPROTO_MPTCP (262) are stream sockets too, and other kernel code than TCP's."""


def seccomp_policy() -> str:
    """The jail's kafel policy: the allow-list above, first matching rule wins."""
    families = " || ".join(f"family == {number}" for number in SOCKET_FAMILIES.values())
    inet = f"(family == {SOCKET_FAMILIES['AF_INET']} || family == {SOCKET_FAMILIES['AF_INET6']})"
    inet_types = " && ".join(
        f"(type & {_SOCK_TYPE_MASK:#x}) != {number}" for number in INET_SOCKET_TYPES.values()
    )
    protocols = " && ".join(f"protocol != {number}" for number in INET_PROTOCOLS.values())
    program = JAILED_UID
    # Identity calls pass only towards the program's uid and no supplementary group (the
    # zygote's children; the program is that uid already, so they change nothing for it);
    # mount and umount2 only with the flags of a scratch mount or of a move of one, unshare
    # only of a network namespace (the zygote's; the program has no capability, the kernel
    # refuses it).
    return f"""
POLICY rl_sandbox {{
  ERRNO(1) {{
    clone {{ (clone_flags & {_CLONE_NEW_ANY:#x}) != 0 }},
    prlimit64 {{ pid != 0 }},
    setresuid(ruid, euid, suid) {{ ruid != {program} || euid != {program} || suid != {program} }},
    setresgid(rgid, egid, sgid) {{ rgid != {program} || egid != {program} || sgid != {program} }},
    setgroups(size, list) {{ size != 0 }},
    mount(source, target, fstype, flags, data) {{
      flags != {MS_NOSUID_NODEV} && flags != {MS_MOVE}
    }},
    umount(target, flags) {{ flags != {MNT_DETACH} }},
    unshare(flags) {{ flags != {CLONE_NEWNET:#x} }},
    {", ".join(SECCOMP_DENIED_EPERM)}
  }},
  ERRNO(38) {{
    {", ".join(SECCOMP_DENIED_ENOSYS)}
  }},
  ERRNO({_ESOCKTNOSUPPORT}) {{
    socket(family, type, protocol) {{ {inet} && {inet_types} }}
  }},
  ERRNO({_EPROTONOSUPPORT}) {{
    socket(family, type, protocol) {{ {inet} && {protocols} }}
  }},
  ALLOW {{
    socket(family, type, protocol) {{ {families} || (family == {_AF_NETLINK} && protocol == 0) }},
    setresuid, setresgid, setgroups, mount, umount, unshare,
    {", ".join(SECCOMP_ALLOWED)}
  }},
  ERRNO(97) {{
    socket
  }}
}}
USE rl_sandbox DEFAULT ERRNO(38)
"""


@dataclass(frozen=True, slots=True)
class JailLayout:
    """Everything the policy depends on, resolved by the worker at start-up."""

    python: str
    """Interpreter path inside the jail."""
    runtime_mounts: tuple[tuple[str, str], ...]
    """(host, jail) directories holding that interpreter and its libraries, mounted read-only."""
    inside_source: str
    """Host directory of the in-jail program (sandbox_service/jail/inside/)."""
    outside_uid: int
    """Unprivileged host uid (and gid) the program's uid maps to; the zygote's is this plus
    ZYGOTE_UID_SHIFT."""
    control_fd: int
    """Descriptor of the control socket, passed through to the zygote."""
    workdir_size_mb: int
    tmp_size_mb: int
    max_file_size_mb: int
    max_open_files: int
    preload: bool
    """Warm mode: import and exercise the scientific stack before serving."""
    once: bool
    """Cold mode: serve one execution, then exit."""
    time_limit_s: int = 0
    """Backstop on the whole jail's life (0: none, for long-lived zygotes)."""
    session: bool = False
    """Session mode: one persistent interpreter runs every cell (notebook semantics)."""
    idle_warm_up: str = "never"
    """Warm mode: when to warm a second standby while the slot is idle (auto, always, never)."""
    start_timeout_s: float = 120.0
    """How long the zygote may take to start (its preload included) before the jail failed."""
    loadavg_fd: int = -1
    """Descriptor of the host's /proc/loadavg, passed through for the idle warm-up's check
    (the jail's own /proc shows its processes only); -1: none."""
    preload_full: bool = False
    """With preload: scipy too, and matplotlib's pyplot in the data zygote (the `preload`
    setting `full`)."""
    preload_zygote: Zygote = "data"
    """With preload: which of a slot's zygotes (jail/zygotes.py) this jail is, so what it
    preloads: the standard library's common modules (lean), and the math stack (math), and
    pandas (data, also the zygote of a slot that keeps one)."""
    matplotlib_cache: str | None = None
    """Host directory of matplotlib's font list (None: programs that plot scan fonts)."""
    run_cgroup_fds: tuple[int, ...] = ()
    """Descriptors of the run cgroups' cgroup.procs (SlotCgroups.run_procs_fds), passed
    through: each process that runs a program moves itself in with them."""


def _system_mounts() -> list[MountPt]:
    mounts: list[MountPt] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            mounts.append(MountPt(src=os.readlink(path), dst=path, is_symlink=True))
        elif os.path.isdir(path):
            mounts.append(MountPt(src=path, dst=path, is_bind=True, rw=False))
    for pattern in TOOLCHAIN_CONFIG_GLOBS:
        for path in sorted(glob.glob(pattern)):
            if os.path.isdir(path) and not os.path.islink(path):
                mounts.append(MountPt(src=path, dst=path, is_bind=True, rw=False))
    return mounts


def scratch_mounts(layout: JailLayout) -> tuple[tuple[str, str], ...]:
    """(directory, tmpfs options) of the writable directories. The working directory belongs
    to the program; /tmp, /mnt and /dev/shm to the zygote, sticky and world-writable. In warm
    mode the zygote mounts each anew for every run (zygote.fresh_scratch)."""

    def options(size_mb: int, mode: str, owner: int) -> str:
        # nr_inodes bounds an inode-fill attack independently of the byte size.
        inodes = max(1024, size_mb * 64)
        return f"size={size_mb}m,nr_inodes={inodes},mode={mode},uid={owner},gid={owner}"

    tmp = layout.tmp_size_mb
    return (
        (WORK_DIR, options(layout.workdir_size_mb, "0755", JAILED_UID)),
        ("/tmp", options(tmp, "1777", ZYGOTE_UID)),
        ("/mnt", options(tmp, "1777", ZYGOTE_UID)),
        ("/dev/shm", options(min(tmp, 64), "1777", ZYGOTE_UID)),
    )


def _scratch(dst: str, options: str) -> MountPt:
    return MountPt(
        dst=dst, fstype="tmpfs", rw=True, is_dir=True, options=options, nosuid=True, nodev=True
    )


def _passwd() -> bytes:
    return (
        f"root:x:0:0::/nonexistent:/usr/sbin/nologin\n"
        f"sandbox:x:{JAILED_UID}:{JAILED_UID}::{WORK_DIR}:/usr/sbin/nologin\n"
    ).encode()


def environment() -> list[str]:
    """The jailed program's entire environment: fixed, nothing of the host's or worker's."""
    return [
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "HOME=" + WORK_DIR,
        "TMPDIR=/tmp",
        "LANG=C.UTF-8",
        "LC_ALL=C.UTF-8",
        "USER=sandbox",
        # One BLAS/OpenMP thread: a forked child must not inherit a thread pool, and the cgroup
        # pids limit counts threads.
        "OMP_NUM_THREADS=1",
        "OPENBLAS_NUM_THREADS=1",
        "MKL_NUM_THREADS=1",
        "NUMEXPR_NUM_THREADS=1",
        "MPLBACKEND=Agg",
        # One string hash for every jail: a set of strings iterates in the same order on every
        # worker, so a seeded run prints the same thing wherever it runs (docs/jail.md, Seeds).
        "PYTHONHASHSEED=0",
    ]


def build_config(layout: JailLayout) -> NsJailConfig:
    """The nsjail configuration of one zygote jail."""
    cfg = NsJailConfig()
    cfg.name = "rl-sandbox"
    cfg.mode = Mode.ONCE
    cfg.hostname = "sandbox"
    cfg.cwd = WORK_DIR
    cfg.time_limit = layout.time_limit_s
    cfg.nice_level = 0
    cfg.keep_env = False
    cfg.envar = environment()
    cfg.keep_caps = False
    cfg.disable_no_new_privs = False
    cfg.pass_fd = (
        [layout.control_fd]
        + ([layout.loadavg_fd] if layout.loadavg_fd >= 0 else [])
        + list(layout.run_cgroup_fds)
    )
    cfg.clone_newnet = True  # an empty network namespace: loopback only, no route anywhere
    cfg.clone_newuser = True
    cfg.clone_newns = True
    cfg.clone_newpid = True
    cfg.clone_newipc = True
    cfg.clone_newuts = True
    cfg.clone_newcgroup = True
    # The first mapping is the identity nsjail runs the zygote as.
    ids = [
        IdMap(inside_id=str(ZYGOTE_UID), outside_id=str(layout.outside_uid + ZYGOTE_UID_SHIFT)),
        IdMap(inside_id=str(JAILED_UID), outside_id=str(layout.outside_uid), count=1),
    ]
    cfg.uidmap = ids
    cfg.gidmap = ids
    cfg.cap = list(ZYGOTE_CAPS)

    cfg.rlimit_as_type = RLimitType.INF  # memory is the cgroup's job: RLIMIT_AS breaks numpy
    cfg.rlimit_cpu_type = RLimitType.INF  # the zygote lives long; each child gets RLIMIT_CPU
    cfg.rlimit_fsize = max(layout.max_file_size_mb, 1)
    cfg.rlimit_nofile = max(layout.max_open_files, 64)
    cfg.rlimit_nproc_type = RLimitType.SOFT  # per-uid and host-wide: the cgroup pids limit rules
    cfg.rlimit_stack_type = RLimitType.SOFT
    cfg.rlimit_core = 0

    cfg.mount = [
        *_system_mounts(),
        *[MountPt(src=src, dst=dst, is_bind=True, rw=False) for src, dst in layout.runtime_mounts],
        MountPt(src=layout.inside_source, dst=INSIDE_DIR_IN_JAIL, is_bind=True, rw=False),
        *(
            [
                MountPt(
                    src=layout.matplotlib_cache,
                    dst=MATPLOTLIB_CACHE_IN_JAIL,
                    is_bind=True,
                    rw=False,
                )
            ]
            if layout.matplotlib_cache
            else []
        ),
        MountPt(src_content=_passwd(), dst="/etc/passwd", is_bind=True, rw=False),
        MountPt(src_content=HOSTS, dst="/etc/hosts", is_bind=True, rw=False),
        MountPt(src_content=NSSWITCH, dst="/etc/nsswitch.conf", is_bind=True, rw=False),
        *[MountPt(src=d, dst=d, is_bind=True, rw=True) for d in DEVICES if os.path.exists(d)],
        # Writable so that a child can raise its own oom_score_adj; what is writable there is
        # guarded by ownership, and the program's uid owns nothing but its own processes'.
        # subset=pid: the jail's processes only (its PID namespace), no host-wide files
        # (meminfo, loadavg, sysvipc, mounts of other namespaces...). hidepid=invisible: a
        # program sees only its own uid's processes, not the zygote; gid: the zygote's group
        # sees them all.
        MountPt(
            dst="/proc",
            fstype="proc",
            rw=True,
            options=f"subset=pid,hidepid=invisible,gid={ZYGOTE_UID}",
        ),
        *[_scratch(dst, options) for dst, options in scratch_mounts(layout)],
        _scratch(MEMBERS_DIR_IN_JAIL, MEMBERS_DIR_OPTIONS),
        # E2B's working directory: code written for an E2B sandbox names /home/user.
        MountPt(src=WORK_DIR, dst=E2B_WORK_DIR, is_symlink=True),
    ]
    cfg.seccomp_string = [seccomp_policy()]

    # -s -P, not -I: -I implies -E, which would ignore PYTHONHASHSEED; the environment is this
    # module's own anyway (keep_env is off).
    args = ["-s", "-P", "-B", ZYGOTE_PATH_IN_JAIL, "--control-fd", str(layout.control_fd)]
    if layout.preload:
        args.append("--preload")
        if layout.preload_full:
            args.append("--preload-full")
        args += ["--preload-zygote", layout.preload_zygote]
    if layout.matplotlib_cache:
        args += ["--matplotlib-cache", MATPLOTLIB_CACHE_IN_JAIL]
    if layout.once:
        args.append("--once")
    if layout.session:
        args.append("--session")
    if layout.idle_warm_up != "never":
        args += ["--idle-warm-up", layout.idle_warm_up]
    if layout.loadavg_fd >= 0:
        args += ["--loadavg-fd", str(layout.loadavg_fd)]
    if layout.run_cgroup_fds:
        args += ["--run-cgroup-fds", ",".join(str(fd) for fd in layout.run_cgroup_fds)]
    args += ["--program-uid", str(JAILED_UID)]
    for dst, options in scratch_mounts(layout):
        args += ["--scratch", f"{dst}:{options}"]
    cfg.exec_bin = Exe(path=layout.python, arg=args)
    return cfg
