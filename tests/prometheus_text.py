"""Reading Prometheus text expositions in tests: prometheus_client's own parser, plus the naming
conventions (prometheus.io/docs/practices/naming) that /metrics must keep."""

from __future__ import annotations

import re

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "rl_sandbox_"
BASE_UNITS = ("seconds", "bytes")
NON_BASE_UNITS = re.compile(
    r"_(ms|milliseconds|us|microseconds|ns|minutes|hours|mb|mib|kb|kib|gb|percent)(_|$)"
)
LABEL_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def families(text: str) -> dict[str, Metric]:
    """The metric families of an exposition by name (a counter's name without `_total`)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample: (sample name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample_names(text: str) -> set[str]:
    """The names a query can select: every sample name (`_total`, `_bucket`, `_count`, ...)."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    return sum(
        value
        for (sample, sample_labels), value in samples(text).items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


def convention_problems(text: str) -> list[str]:
    """Where the exposition breaks the naming conventions (empty when it keeps them)."""
    problems = []
    for line in text.splitlines():
        if line.startswith("# TYPE ") and line.split()[3] == "untyped":
            problems.append(f"{line.split()[2]}: untyped")
        words = line.split()
        if (
            words[:2] == ["#", "TYPE"]
            and words[3:] == ["counter"]
            and not words[2].endswith("_total")
        ):
            problems.append(f"{words[2]}: a counter without _total")
    helped = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    for name, family in families(text).items():
        shown = f"{name}_total" if family.type == "counter" else name
        if not name.startswith(PREFIX):
            problems.append(f"{name}: not under {PREFIX}")
        if shown not in helped or not family.documentation.strip():
            problems.append(f"{shown}: no HELP")
        if shown not in typed:
            problems.append(f"{shown}: no TYPE")
        if NON_BASE_UNITS.search(name):
            problems.append(f"{name}: not in base units ({', '.join(BASE_UNITS)})")
        if family.type in ("histogram", "summary") and not name.endswith(BASE_UNITS):
            problems.append(f"{name}: a {family.type} needs its unit as the suffix")
        if family.type == "gauge" and name.endswith("_total"):
            problems.append(f"{name}: a gauge named like a counter")
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                problems.append(f"{sample.name}: a counter without _total")
            bad_labels = [k for k in sample.labels if not LABEL_NAME.match(k)]
            problems += [f"{sample.name}: label {k!r}" for k in bad_labels]
    return sorted(set(problems))
