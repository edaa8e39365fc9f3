"""The per-tenant series: the only place a tenant's name or figures become metrics.

Served by `GET /metrics/tenants` (operations.py) to a key: a tenant's key gets its own series,
the operator key (setting `operator_key`) every tenant's. The open `GET /metrics` carries the
same counts summed over tenants (metrics.py). A new per-tenant series is added here, so that it
can only be served to a key; one read at the scrape (a gauge from Redis) is set by the
`/metrics/tenants` route (operations.py) before `render`.

Each series carries a `tenant` label ("" for requests that presented no valid key, which only
the operator sees); the names carry `tenant_` after the prefix, so that a scrape of both paths
into one Prometheus never sums a tenant's count with the aggregate of the same name.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class TenantMetrics:
    """The per-tenant counters of one API process; `render` gives one tenant's, or all."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_responses = Counter(
            "rl_sandbox_tenant_http_responses",
            "HTTP responses by tenant (empty: no valid key), route and status code",
            ["tenant", "route", "code"], registry=r,
        )  # fmt: skip
        self.executions = Counter(
            "rl_sandbox_tenant_executions", "Execution results by tenant and status",
            ["tenant", "status"], registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "rl_sandbox_tenant_rejected_requests",
            "Requests refused before running, by tenant and reason",
            ["tenant", "reason"], registry=r,
        )  # fmt: skip
        self.recorded_bytes = Gauge(
            "rl_sandbox_tenant_session_recorded_bytes",
            "Bytes of recorded session cells a tenant keeps in Redis (a prefix its forks share "
            "counted once), against max_tenant_recorded_bytes; read at the scrape",
            ["tenant"], registry=r,
        )  # fmt: skip

    def set_recorded_bytes(self, by_tenant: dict[str, int]) -> None:
        """The recorded-bytes gauge from a fresh read (tenants no longer listed are dropped)."""
        self.recorded_bytes.clear()
        for tenant, size in by_tenant.items():
            self.recorded_bytes.labels(tenant).set(size)

    def render(self, tenant: str | None) -> bytes:
        """The Prometheus text of `tenant`'s series only, or of every tenant's (None)."""
        if tenant is None:
            return generate_latest(self.registry)
        one = CollectorRegistry(auto_describe=False)
        one.register(_OneTenant(self.registry, tenant))
        return generate_latest(one)


class _OneTenant(Collector):
    """The families of a registry with only the samples labelled with one tenant."""

    def __init__(self, registry: CollectorRegistry, tenant: str) -> None:
        self._registry = registry
        self._tenant = tenant

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if s.labels.get("tenant") == self._tenant]
            yield family
