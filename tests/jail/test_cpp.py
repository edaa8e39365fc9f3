"""C++ in real jails (warm and cold): compile errors, limits, hostile programs, the binary cache."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.jail.compiled import BinaryCache, run_program
from sandbox_service.jail.languages import ARTIFACT_NAME as BINARY_NAME
from tests.jail.conftest import TEST_LIMITS

REVERSE = """#include <bits/stdc++.h>
int main() { std::string s; std::cin >> s; std::reverse(s.begin(), s.end());
             std::cout << s << std::endl; }
"""


def run(
    executor: JailExecutor,
    cache: BinaryCache,
    source: str,
    stdin: str = "",
    tenant: str = "t1",
    compile_timeout_s: float = 30.0,
    **limits: object,
) -> ExecutionResult:
    spec = ExecutionSpec(code=source, stdin=stdin, limits=replace(TEST_LIMITS, **limits))  # type: ignore[arg-type]
    failures = executor.jail_failures
    result = run_program("cpp", spec, executor.run, cache, tenant, compile_timeout_s)
    assert executor.jail_failures == failures, f"the jail failed under this program: {result}"
    return result


@pytest.fixture
def cache(tmp_path: Path) -> BinaryCache:
    return BinaryCache(tmp_path / "cpp-cache")


def test_a_program_compiles_reads_stdin_and_prints(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    result = run(executor, cache, REVERSE, stdin="abc\n")
    assert (result.status, result.stdout, result.exit_code) == (Status.OK, "cba\n", 0)
    assert result.compile is not None and result.compile.status is Status.OK
    assert not result.compile.cached and result.compile.wall_time > 0


def test_a_compile_error_is_an_error_with_the_compilers_messages(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    result = run(executor, cache, "int main() { return undeclared; }\n")
    assert result.status is Status.ERROR and result.wall_time == 0
    assert "main.cpp:1:" in result.stderr and "undeclared" in result.stderr
    assert result.compile is not None and result.compile.status is Status.ERROR
    assert result.compile.exit_code not in (0, None)


def test_exit_codes_and_signals_are_the_binarys(executor: JailExecutor, cache: BinaryCache) -> None:
    exited = run(executor, cache, "int main() { return 3; }\n")
    assert (exited.status, exited.exit_code) == (Status.ERROR, 3)
    crashed = run(executor, cache, "int main() { volatile int* p = nullptr; return *p; }\n")
    assert crashed.status in (Status.ERROR, Status.KILLED) and crashed.signal == 11


def test_the_run_has_its_time_limit(executor: JailExecutor, cache: BinaryCache) -> None:
    result = run(executor, cache, "int main() { for (;;) {} }\n", timeout_s=1.0)
    assert result.status is Status.TIMEOUT
    assert result.compile is not None and result.compile.status is Status.OK


def test_the_compile_has_its_time_limit(executor: JailExecutor, cache: BinaryCache) -> None:
    # Template instantiation that takes the compiler far longer than a second.
    slow = (
        "template <int N> struct F { static const long v = F<N - 1>::v + F<N - 2>::v; };\n"
        "template <> struct F<1> { static const long v = 1; };\n"
        "template <> struct F<0> { static const long v = 0; };\n"
        "#include <bits/stdc++.h>\n"
        "template <int D> struct T { static long f() { return T<D - 1>::f() + "
        "std::map<int, std::tuple<T<D - 1>*, std::vector<std::string>>>().size(); } };\n"
        "template <> struct T<0> { static long f() { return 0; } };\n"
        "int main() { return T<900>::f() + F<80>::v; }\n"
    )
    result = run(executor, cache, slow, compile_timeout_s=1.0)
    assert result.status is Status.ERROR and result.wall_time == 0
    assert result.compile is not None and result.compile.status is Status.TIMEOUT
    assert "compilation exceeded its limit of 1 s" in result.stderr


def test_a_fork_bomb_is_held_by_the_process_limit(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    bomb = (
        "#include <unistd.h>\n#include <cstdio>\n"
        "int main() { int made = 0; for (int i = 0; i < 1000; ++i) { pid_t p = fork();"
        " if (p == 0) { pause(); _exit(0); } if (p > 0) ++made; }"
        ' printf("%d\\n", made); return 0; }\n'
    )
    result = run(executor, cache, bomb, timeout_s=5.0)
    assert result.status is Status.OK, result
    assert int(result.stdout) < TEST_LIMITS.max_processes
    assert run(executor, cache, REVERSE, stdin="ok").stdout == "ko\n"


def test_no_network_and_no_writes_outside_the_jails_scratch(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    probe = r"""#include <arpa/inet.h>
#include <cstdio>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
int main() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(53);
  inet_pton(AF_INET, "8.8.8.8", &a.sin_addr);
  printf("connect %d\n", connect(s, (sockaddr*)&a, sizeof a));
  printf("udp %d\n", socket(AF_INET, SOCK_DGRAM, 0) >= 0);
  const char* outside[] = {"/etc/passwd", "/usr/bin/evil", "/opt/rl-sandbox/inside/pid1.py"};
  for (const char* path : outside)
    printf("%s %d\n", path, open(path, O_WRONLY | O_CREAT, 0644) >= 0);
  printf("home %d\n", open("/home/sandbox/mine.txt", O_WRONLY | O_CREAT, 0644) >= 0);
}
"""
    result = run(executor, cache, probe)
    assert result.status is Status.OK, result
    assert result.stdout.splitlines() == [
        "connect -1",
        "udp 0",
        "/etc/passwd 0",
        "/usr/bin/evil 0",
        "/opt/rl-sandbox/inside/pid1.py 0",
        "home 1",
    ]


def test_the_cache_serves_a_tenant_its_own_binaries_only(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    source = REVERSE + "// cache test\n"
    started = time.monotonic()
    miss = run(executor, cache, source, stdin="ab", tenant="alice")
    miss_s = time.monotonic() - started
    started = time.monotonic()
    hit = run(executor, cache, source, stdin="cd", tenant="alice")
    hit_s = time.monotonic() - started
    other = run(executor, cache, source, stdin="ef", tenant="bob")
    assert (miss.stdout, hit.stdout, other.stdout) == ("ba\n", "dc\n", "fe\n")
    assert miss.compile is not None and hit.compile is not None and other.compile is not None
    assert (miss.compile.cached, hit.compile.cached, other.compile.cached) == (False, True, False)
    print(f"\nC++ {executor.mode}: compile and run {miss_s:.3f} s, cached binary {hit_s:.3f} s")


def test_a_poisoned_cache_entry_of_another_tenant_is_never_run(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    from sandbox_service.jail.compiled import cache_key
    from sandbox_service.jail.languages import toolchain

    cache.put(
        "mallory",
        cache_key(toolchain("cpp", ExecutionSpec(code=REVERSE)), REVERSE),
        b"#!/bin/sh\necho pwned\n",
    )
    result = run(executor, cache, REVERSE, stdin="xy", tenant="alice")
    assert result.stdout == "yx\n"
    assert BINARY_NAME not in result.files


def test_a_compile_bomb_is_held_by_the_compile_limits(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    # The preprocessor reading an endless file: memory or time runs out, the jail stays sound.
    result = run(executor, cache, '#include "/dev/zero"\nint main() {}\n', compile_timeout_s=3.0)
    assert result.status is Status.ERROR and result.wall_time == 0
    assert result.compile is not None
    assert result.compile.status in (Status.TIMEOUT, Status.MEMORY_LIMIT), result.compile
    assert run(executor, cache, REVERSE, stdin="ok").stdout == "ko\n"


def test_a_cache_root_that_is_not_this_users_private_folder_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert not BinaryCache(shared).usable()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "private")
    (tmp_path / "private").mkdir(mode=0o700)
    assert not BinaryCache(link).usable()
    fresh = BinaryCache(tmp_path / "fresh" / "cache")
    assert fresh.usable()
    fresh.put("t", "k", b"binary")
    assert fresh.get("t", "k") == b"binary" and fresh.get("u", "k") is None


def test_a_header_among_the_files_is_compiled_in_and_keys_the_cache(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    source = '#include <cstdio>\n#include "answer.h"\nint main() { printf("%d\\n", ANSWER); }\n'

    def with_header(value: int) -> ExecutionResult:
        header = {"answer.h": f"#define ANSWER {value}\n".encode()}
        spec = ExecutionSpec(code=source, files=header, limits=TEST_LIMITS)
        return run_program("cpp", spec, executor.run, cache, "t1", 30.0)

    assert with_header(42).stdout == "42\n"
    changed = with_header(7)
    assert changed.stdout == "7\n" and changed.compile is not None and not changed.compile.cached
