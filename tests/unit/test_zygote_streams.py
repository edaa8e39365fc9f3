"""inside/child.py make_children_std_streams: the streams every standby installs, made once."""

from __future__ import annotations

from tests.unit.fresh_interpreter import run_python


def test_the_streams_are_made_over_a_pipe_and_the_zygotes_descriptors_come_back() -> None:
    # The zygote's own stdout is a log file, which seeks; a program's is a pipe. A stream made
    # over the log file keeps claiming it can seek once a pipe is put under it.
    out = run_python(
        """
        import os, tempfile
        from sandbox_service.jail.inside import child as jail_child
        report_to = os.fdopen(os.dup(1), "w")
        log = tempfile.TemporaryFile()
        os.dup2(log.fileno(), 1)
        os.close(0)  # a zygote started without one: its slot must stay free, not take a pipe
        before = (os.fstat(1).st_ino, sorted(os.listdir("/proc/self/fd")))
        jail_child.make_children_std_streams()
        after = (os.fstat(1).st_ino, sorted(os.listdir("/proc/self/fd")))
        streams = jail_child._CHILDREN_STD_STREAMS[0]
        seekable = [s.seekable() for s in streams]
        print(seekable, before == after, streams[2].line_buffering, file=report_to)
        """
    )
    assert out == "[False, False, False] True True"


def test_a_child_writes_through_them_to_its_own_pipe() -> None:
    out = run_python(
        """
        import os
        from sandbox_service.jail.inside import child as jail_child
        jail_child.make_children_std_streams()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.dup2(w, 1)
            jail_child._install_std_streams(jail_child._CHILDREN_STD_STREAMS[0])
            print("from the child")
            import sys
            sys.stdout.flush()
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        print(os.read(r, 100).decode().strip())
        """
    )
    assert out == "from the child"
