"""`!pip install` and `%pip install` in a cell: the jail has no network, so pip is answered
from what the image has installed. A requirement that is installed answers as pip does for an
already satisfied one; anything else fails as pip fails offline, saying why.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass

NO_NETWORK = (
    "ERROR: the sandbox has no network: pip can install nothing here. Only the packages the "
    "image ships are importable (`pip list` shows them)."
)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")
_OPTIONS_WITH_VALUE = frozenset(
    {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-t", "--target",
     "--prefix", "--root", "-c", "--constraint", "--platform", "--python-version",
     "--implementation", "--abi", "--progress-bar", "--trusted-host", "--proxy", "--timeout",
     "--retries", "--cache-dir", "--src", "--upgrade-strategy"}
)  # fmt: skip


@dataclass(frozen=True)
class PipAnswer:
    stdout: str
    stderr: str
    status: int


def is_pip_command(words: list[str]) -> bool:
    """`pip ...`, `pip3 ...`, `python -m pip ...` (any python)."""
    if words and re.fullmatch(r"pip(3(\.\d+)?)?", words[0].rsplit("/", 1)[-1]):
        return True
    return (
        len(words) >= 3
        and re.fullmatch(r"python(3(\.\d+)?)?", words[0].rsplit("/", 1)[-1]) is not None
        and words[1:3] == ["-m", "pip"]
    )


def pip_words(command: str) -> list[str] | None:
    """The words of a shell command if it is a pip command alone, else None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not is_pip_command(words) or any(w in {"&&", "||", ";", "|"} for w in words):
        return None
    return words[3:] if words[1:3] == ["-m", "pip"] else words[1:]


def answer(args: list[str]) -> PipAnswer:
    """pip's answer to `pip <args>` in the jail."""
    if not args or args[0] in {"-h", "--help", "help"}:
        return PipAnswer("", "Usage: pip install <package> ... (" + NO_NETWORK[7:] + ")\n", 1)
    command, rest = args[0], args[1:]
    if command == "install":
        return _install(rest)
    if command in {"list", "freeze"}:
        return PipAnswer(_listing(freeze=command == "freeze"), "", 0)
    return PipAnswer(
        "", f"ERROR: `pip {command}` is not available in the sandbox. {NO_NETWORK}\n", 1
    )


def _install(args: list[str]) -> PipAnswer:
    requirements: list[str] = []
    skip_next = False
    for word in args:
        if skip_next:
            skip_next = False
        elif word in {"-r", "--requirement", "-e", "--editable"}:
            return PipAnswer("", f"ERROR: `pip install {word}` cannot run here. {NO_NETWORK}\n", 1)
        elif word in _OPTIONS_WITH_VALUE:
            skip_next = True
        elif not word.startswith("-"):
            requirements.append(word)
    if not requirements:
        return PipAnswer("", "ERROR: You must give at least one requirement to install\n", 1)
    lines, missing = [], []
    for requirement in requirements:
        found = _installed(requirement)
        if found is None:
            missing.append(requirement)
        else:
            lines.append(found)
    if missing:
        errors = "".join(
            f"ERROR: Could not find a version that satisfies the requirement {r} "
            f"(from versions: none)\nERROR: No matching distribution found for {r}\n"
            for r in missing
        )
        return PipAnswer("", errors + NO_NETWORK + "\n", 1)
    return PipAnswer("".join(line + "\n" for line in lines), "", 0)


def _installed(requirement: str) -> str | None:
    """pip's line for an installed distribution that satisfies `requirement`, or None."""
    from importlib import metadata

    match = _REQUIREMENT.match(requirement)
    if match is None:
        return None
    name, spec = match.group(1), match.group(2).strip()
    try:
        distribution = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    version = distribution.version
    if spec and not _satisfies(version, spec):
        return None
    location = _site_packages(distribution)
    return f"Requirement already satisfied: {requirement} in {location} ({version})"


def _satisfies(version: str, spec: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except InvalidSpecifier:
        return False


def _site_packages(distribution: object) -> str:
    locate = getattr(distribution, "locate_file", None)
    if locate is not None:
        return str(locate(""))
    return next((p for p in sys.path if p.endswith("site-packages")), "site-packages")


def _listing(freeze: bool) -> str:
    from importlib import metadata

    found = {d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"]}
    names = sorted(found, key=str.lower)
    if freeze:
        return "".join(f"{name}=={found[name]}\n" for name in names)
    width = max((len(name) for name in names), default=7)
    head = f"{'Package':<{width}} Version\n{'-' * width} -------\n"
    return head + "".join(f"{name:<{width}} {found[name]}\n" for name in names)
