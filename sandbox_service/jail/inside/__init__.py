"""The in-jail program: the zygote, PID 1 of one nsjail, and the processes it forks.

Every module here runs *inside* the jail under the jailed interpreter, with the standard library
and the preloaded scientific stack only; none may import sandbox_service (or anything but the
standard library and its siblings, by relative import). Inside the jail the directory is mounted
at /opt/rl-sandbox/inside and started as a script (`__main__.py`), which loads it as a package by
path. The worker imports `protocol` alone, for the framing and the typed messages.

Protocol (a Unix stream socket on the descriptor named by --control-fd): length-prefixed JSON
frames of the typed messages in protocol.py (Ready, Control, RunRequest, RunReply). A RunRequest
carries four file descriptors (code memfd, stdin, stdout and stderr pipe write ends) in
SCM_RIGHTS on its first byte.

    zygote -> worker  Ready
    worker -> zygote  Control("serve")  (once the zygote is in the slot's cgroups)
    worker -> zygote  RunRequest ...    zygote -> worker  RunReply ...
    worker -> zygote  Control("exit")

The program never holds a descriptor of this path: the standby that takes a request tells the
zygote on a private pipe and closes it before the program starts; the exit status, signal and
CPU time are then the kernel's (wait4 on the program's process).

Why PID 1: the kernel ignores SIGKILL sent to a PID namespace's init from inside it, and
`kill(-1, SIGKILL)` from init reaches every other process of the namespace, daemonised
grandchildren included. The zygote is made non-dumpable, so its /proc files belong to root and
its memory cannot be read or written; seccomp denies ptrace and prlimit on other processes.

Modules, one mechanism each: protocol (framing, messages), libc (kernel calls), imports (after-
import hooks), files (scratch roots, input and fetched files), outputs (displays, figures,
errors), formatters (a value's rich representations), heap (preload and the shape of the warm
heap), child (running one program), finish (a program's end, as the interpreter's), process
(PID 1's process control), serve (plain runs), member, family and session (sessions and forks),
cell_syntax, shell, magics and pip_answer (notebook syntax in cells), pid1 (main).
"""
