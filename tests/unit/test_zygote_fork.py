"""inside/libc.py fork_lean: fork(2) without CPython's at-fork work, only where that is sound."""

from __future__ import annotations

from tests.unit.fresh_interpreter import run_python


def test_a_lean_child_is_a_working_interpreter_of_its_own() -> None:
    out = run_python(
        """
        import os, threading
        from sandbox_service.jail.inside import libc
        r, w = os.pipe()
        pid = libc.fork_lean()
        if pid == 0:
            t = threading.Thread(target=lambda: None)
            t.start()
            t.join()
            ok = threading.main_thread().native_id == threading.get_native_id() == os.getpid()
            os.write(w, b"ok" if ok else b"stale")
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print(os.read(r, 16).decode(), os.waitstatus_to_exitcode(status))
        """
    )
    assert out == "ok 0"


def test_with_a_second_thread_it_is_os_fork() -> None:
    # os.fork's handlers forget the other threads in the child; a lean fork would not.
    out = run_python(
        """
        import os, threading
        from sandbox_service.jail.inside import libc
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        r, w = os.pipe()
        pid = libc.fork_lean()
        if pid == 0:
            os.write(w, str(threading.active_count()).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        stop.set()
        print(threading.active_count(), os.read(r, 16).decode())
        """
    )
    assert out == "2 1", "the child still saw the parent's other thread"
