"""Who is calling: the tenant an API key belongs to, and the names a tenant's objects get (pure).

The edge authenticates a request and binds its Tenant in `tenant_var` for the request's task;
every route that creates or finds a tenant's object (a session, a group, a fork, a sandbox)
names it through `scoped`, so that the same client-chosen id of two tenants never meets in
Redis or in a worker, and an id of one tenant is simply absent (404) for another.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass

TENANT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A tenant's name: it prefixes the internal ids of its objects, so it never contains `/`."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """One API key's owner: its name, weight in fair share, and quotas (None: the server's)."""

    name: str
    weight: float = 1.0
    max_in_flight: int | None = None
    max_sessions: int | None = None


DEFAULT_TENANT = Tenant("default")
"""The tenant of a server with no key or a single `api_key`."""

tenant_var: ContextVar[Tenant] = ContextVar("tenant", default=DEFAULT_TENANT)
"""The tenant of the request the current task serves (the edge sets it)."""


def configured(tenants: dict[str, Tenant], name: str) -> Tenant:
    """The tenant named `name` with its configured weight and quotas (`tenants` by name); a name
    no longer configured keeps only its name (its objects stay its own, no quota applies)."""
    return tenants.get(name) or Tenant(name)


def scoped(tenant: Tenant, ident: str) -> str:
    """The internal id of a tenant's object named `ident` by the client."""
    return f"{tenant.name}/{ident}"


def tenant_of(internal: str) -> str:
    """The tenant's name of an internal id made by `scoped` ("default" for one without `/`)."""
    name, slash, _ = internal.partition("/")
    return name if slash else DEFAULT_TENANT.name


def unscoped(tenant: Tenant, internal: str) -> str | None:
    """The client's id of `internal` when it belongs to `tenant`, else None."""
    prefix = f"{tenant.name}/"
    return internal[len(prefix) :] if internal.startswith(prefix) else None
