"""Whether this kernel offers transparent huge pages (the zygote puts its heap and code there)."""

from __future__ import annotations

import pytest


def thp_offered() -> bool:
    """True unless THP is off ("never") or the kernel has none."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


needs_thp = pytest.mark.skipif(
    not thp_offered(), reason="the kernel offers no transparent huge pages"
)
