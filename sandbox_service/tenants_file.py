"""The tenants file (setting `tenants_file`): API keys, each with its tenant (pure parse, one read).

    [[tenant]]
    name = "run-a"            # [A-Za-z0-9_-]{1,64}, unique
    key = "..."               # the Bearer key, unique, non-empty
    weight = 2                # optional, > 0 (default 1): its share of saturated workers
    max_in_flight = 4096      # optional, >= 1: calls admitted and not yet answered
    max_sessions = 256        # optional, >= 1: live sessions

Every mistake is refused with a message naming the table and the field, so that a bad file stops
the server at start-up rather than admitting a key nobody meant.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_service.tenancy import DEFAULT_TENANT, TENANT_NAME, Tenant

FIELDS = frozenset({"name", "key", "weight", "max_in_flight", "max_sessions"})


class TenantsFileError(ValueError):
    """The tenants file cannot be read or is not valid."""


@dataclass(frozen=True, slots=True)
class Credential:
    """One API key and the tenant it authenticates."""

    key: bytes
    tenant: Tenant

    def __repr__(self) -> str:  # never print a key in a log or a traceback
        return f"Credential(tenant={self.tenant!r})"


def single_key(api_key: str | None) -> tuple[Credential, ...]:
    """The credentials of a server with the single setting `api_key` (none: an open server)."""
    return () if not api_key else (Credential(api_key.encode(), DEFAULT_TENANT),)


def load_credentials(path: Path) -> tuple[Credential, ...]:
    """The credentials in the tenants file at `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantsFileError(f"tenants_file {str(path)!r} cannot be read: {exc}") from None
    return parse(text, str(path))


def parse(text: str, source: str = "tenants_file") -> tuple[Credential, ...]:
    """The credentials in the TOML text of a tenants file."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TenantsFileError(f"{source}: not valid TOML: {exc}") from None
    extra = sorted(set(document) - {"tenant"})
    if extra:
        raise TenantsFileError(f"{source}: unknown top-level entries {extra}; only [[tenant]]")
    tables = document.get("tenant")
    if not isinstance(tables, list) or not tables:
        raise TenantsFileError(f"{source}: no [[tenant]] table")
    credentials = tuple(
        _credential(table, f"{source}: tenant {i}") for i, table in enumerate(tables)
    )
    _unique([c.tenant.name for c in credentials], source, "name")
    _unique([c.key for c in credentials], source, "key")
    return credentials


def _credential(table: Any, where: str) -> Credential:
    if not isinstance(table, dict):
        raise TenantsFileError(f"{where}: must be a table")
    unknown = sorted(set(table) - FIELDS)
    if unknown:
        raise TenantsFileError(f"{where}: unknown fields {unknown}; allowed: {sorted(FIELDS)}")
    name = table.get("name")
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        raise TenantsFileError(f"{where}: `name` must be 1 to 64 characters of [A-Za-z0-9_-]")
    where = f"{where} ({name})"
    key = table.get("key")
    if not isinstance(key, str) or not key.strip():
        raise TenantsFileError(f"{where}: `key` must be a non-empty string")
    if key != key.strip() or not key.isascii() or not key.isprintable():
        raise TenantsFileError(f"{where}: `key` must be printable ASCII without outer spaces")
    weight = table.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise TenantsFileError(f"{where}: `weight` must be a number")
    if not math.isfinite(weight) or weight <= 0:
        raise TenantsFileError(f"{where}: `weight` must be a finite number > 0")
    return Credential(
        key=key.encode(),
        tenant=Tenant(
            name=name,
            weight=float(weight),
            max_in_flight=_bound(table, "max_in_flight", where),
            max_sessions=_bound(table, "max_sessions", where),
        ),
    )


def _bound(table: dict[str, Any], field: str, where: str) -> int | None:
    value = table.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TenantsFileError(f"{where}: `{field}` must be an integer >= 1")
    return value


def _unique(values: list[Any], source: str, field: str) -> None:
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if value in seen:
            shown = f" {value!r}" if field == "name" else ""
            raise TenantsFileError(f"{source}: tenant {i}: `{field}`{shown} is not unique")
        seen.add(value)
