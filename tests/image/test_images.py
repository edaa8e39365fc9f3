"""The images themselves: small, no build tools, non-root where possible, entry points that are the
CLI's commands, healthchecks that pass when the service serves and fail when it does not.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.image import stack as podman_stack
from tests.image.stack import Stack

API = f"localhost/rl-sandbox-api:{podman_stack.IMAGE_TAG}"
WORKER = f"localhost/rl-sandbox-worker:{podman_stack.IMAGE_TAG}"
REDIS = f"localhost/rl-sandbox-redis:{podman_stack.IMAGE_TAG}"
MB = 10**6
SIZE_BOUND_MB = {API: 850, WORKER: 1550, REDIS: 200}
"""Uncompressed, as `podman image inspect` counts. api: about 770 MB, most of it scipy, sympy,
numpy, pandas, matplotlib and IPython; worker about 1,390 MB (docs/deploy.md, "Try it with podman
or Docker"); a bound catches a build stage's tools or caches leaking into a runtime image."""
WORKER_OVER_API_MB = 700
"""The worker adds Debian's libnl, `mount` and the entry point to the api's layers (a few MB),
g++ with libc6-dev, which compile `language: "cpp"` programs in the jails (about 250 MB
installed: gcc-12 68, g++-12 36, cpp-12 34, libstdc++ and libgcc headers 34, binutils 26, the
sanitizer runtimes gcc depends on 16, libc6-dev 12), and the JDK and node for `java` and
`javascript` (Debian's installed sizes: openjdk-17-jre-headless 189, -jdk-headless 77,
libnode108 46, nodejs 4, with their libraries about 380 MB)."""
BUILD_TOOLS = ("gcc", "cc", "c++", "make", "ld", "as", "uv", "git", "curl", "wget")
CPP_TOOLCHAIN = ("gcc", "cc", "c++", "ld", "as")
"""Build tools the worker carries on purpose: g++ runs inside the jails (docs/service.md, "C++")."""


def inspect(image: str) -> dict[str, object]:
    info: dict[str, object] = json.loads(podman_stack.podman("image", "inspect", image))[0]
    return info


def config(image: str) -> dict[str, object]:
    value = inspect(image)["Config"]
    assert isinstance(value, dict)
    return value


def size_mb(image: str) -> float:
    return float(str(inspect(image)["Size"])) / MB


def shell(image: str, script: str) -> str:
    """Run a shell script in a throwaway container of the image (no network, no privilege)."""
    return podman_stack.podman(
        "run", "--rm", "--network", "none", "--cap-drop", "ALL", "--entrypoint", "sh", image,
        "-c", script,
    )  # fmt: skip


@contextmanager
def idle_container(image: str, *options: str) -> Iterator[str]:
    """A container of the image that runs `sleep` instead of its service; removed afterwards.

    Labelled with the stack's project, so a run killed outright leaves nothing that the next
    run's teardown would not remove.
    """
    name = f"{podman_stack.PROJECT}-idle-{uuid.uuid4().hex[:8]}"
    label = f"io.podman.compose.project={podman_stack.PROJECT}"
    podman_stack.podman(
        "run", "--detach", "--name", name, "--label", label, "--cap-drop", "ALL",
        *options, "--entrypoint", "sleep", image, "300",
    )  # fmt: skip
    try:
        yield name
    finally:
        podman_stack.podman("rm", "--force", "--time", "0", name, check=False)


def healthcheck(container: str) -> tuple[int, str]:
    """Run the container's healthcheck once: podman's exit status, and the check's last output."""
    done = subprocess.run(
        ["podman", "healthcheck", "run", container],
        env=podman_stack.podman_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    state = json.loads(podman_stack.podman("inspect", container))[0]["State"]
    log = (state.get("Health") or state.get("Healthcheck") or {}).get("Log") or [{}]
    return done.returncode, str(log[-1].get("Output", ""))


def test_image_sizes_are_reported_and_small(images: dict[str, float]) -> None:
    sizes = {image: size_mb(image) for image in SIZE_BOUND_MB}
    report = json.loads((podman_stack.ROOT / "reports" / "image" / "build.json").read_text())
    assert set(report["size_bytes"]) == {"base", "api", "worker", "redis"}, report
    for image, bound in SIZE_BOUND_MB.items():
        assert sizes[image] < bound, f"{image}: {sizes[image]:.0f} MB, bound {bound} MB"
    assert sizes[WORKER] - sizes[API] < WORKER_OVER_API_MB, sizes


@pytest.mark.parametrize("image", [API, WORKER])
def test_the_runtime_images_carry_no_build_tools(images: dict[str, float], image: str) -> None:
    # Multi-stage: the build stage's uv, sources and caches stay there; apt leaves no lists.
    tools = [t for t in BUILD_TOOLS if image == API or t not in CPP_TOOLCHAIN]
    probe = f"for t in {' '.join(tools)}; do command -v $t; done"
    leftovers = "ls -d /src /opt/venv/bin/uv /root/.cache /var/lib/apt/lists/* 2>/dev/null"
    found = shell(image, f"{probe}; {leftovers}; find / -xdev -name '*.deb' 2>/dev/null; true")
    assert found.split() == [], found


def test_the_api_image_runs_unprivileged(images: dict[str, float]) -> None:
    assert config(API)["User"] == "10001:10001"
    ids = shell(API, "id -u; id -g")
    assert ids.split() == ["10001", "10001"], ids


def test_the_running_services_are_not_root_except_the_worker(compose_stack: Stack) -> None:
    for service, uid in (("api", "10001"), ("redis", "999"), ("worker", "0")):
        (container,) = podman_stack.containers(service)
        status = podman_stack.podman("exec", container, "cat", "/proc/1/status")
        (uids,) = [line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")]
        assert uids == [uid] * 4, (service, uids)


@pytest.mark.parametrize(
    ("image", "entrypoint", "command"),
    [
        (API, ["rl-sandbox"], ["api", "--host", "0.0.0.0", "--port", "8000"]),
        (WORKER, ["rl-sandbox-worker-entrypoint", "rl-sandbox"], ["worker"]),
    ],
)
def test_the_entrypoints_are_the_cli_commands(
    images: dict[str, float], image: str, entrypoint: list[str], command: list[str]
) -> None:
    assert (config(image)["Entrypoint"], config(image)["Cmd"]) == (entrypoint, command)
    # The image's own CLI accepts that command line (argparse: --help exits 0 only for a known
    # command and known options).
    usage = podman_stack.podman(
        "run", "--rm", "--network", "none", "--cap-drop", "ALL",
        "--entrypoint", entrypoint[-1], image, *command, "--help",
    )  # fmt: skip
    assert usage.startswith(f"usage: rl-sandbox {command[0]} "), usage
    if len(entrypoint) > 1:
        assert (
            shell(image, f"command -v {entrypoint[0]}").strip() == f"/usr/local/bin/{entrypoint[0]}"
        )


@pytest.mark.parametrize("image", [API, WORKER])
def test_the_images_keep_their_healthcheck(images: dict[str, float], image: str) -> None:
    # Docker's image format keeps HEALTHCHECK (OCI's has none: scripts/image/build.sh says so).
    check = inspect(image).get("Healthcheck")
    assert isinstance(check, dict) and check["Test"][0] == "CMD", check


def test_the_api_healthcheck_fails_when_nothing_serves(images: dict[str, float]) -> None:
    with idle_container(API, "--network", "none") as name:
        status, output = healthcheck(name)
    assert status != 0, output
    assert "urllib" in output, output  # the check ran (podman keeps the start of its output)


def test_the_worker_healthcheck_fails_without_a_live_worker(compose_stack: Stack) -> None:
    # On the stack's own network with its Redis reachable: the check looks for this host's own
    # worker heartbeat, not just for Redis, so a container whose worker is gone is unhealthy.
    network = f"{podman_stack.PROJECT}_backend"
    env = ["--env", "REDIS_URL=redis://redis:6379/0", "--env", "RL_SANDBOX_QUEUE_NAME=rl-sandbox"]
    with idle_container(WORKER, "--network", network, *env) as name:
        status, output = healthcheck(name)
    assert status != 0, output
    assert "no worker of" in output, output


def test_the_worker_image_has_the_cpp_compiler(images: dict[str, float]) -> None:
    assert shell(WORKER, "command -v g++").strip() == "/usr/bin/g++"


def test_the_worker_image_has_the_jdk_javatuples_and_node(images: dict[str, float]) -> None:
    found = shell(
        WORKER,
        "ls /usr/lib/jvm/java-17-openjdk-*/bin/javac; ls /usr/share/java/javatuples.jar;"
        " ls -d /etc/java-*-openjdk; command -v node",
    ).split()
    assert found[0].endswith("/bin/javac") and found[1:] == [
        "/usr/share/java/javatuples.jar",
        "/etc/java-17-openjdk",
        "/usr/bin/node",
    ], found
