"""Server settings: one Settings object built at start-up and passed down (env RL_SANDBOX_*)."""

from __future__ import annotations

import difflib
import os
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from sandbox_service.execution import Limits
from sandbox_service.tenancy import DEFAULT_TENANT, Tenant
from sandbox_service.tenants_file import (
    Credential,
    TenantsFileError,
    load_credentials,
    single_key,
)

ExecutorMode = Literal["warm", "cold"]

ENV_PREFIX = "RL_SANDBOX_"


class UnknownSettingError(ValueError):
    """An RL_SANDBOX_* environment variable names no setting (a typo must not be ignored)."""


def unknown_settings(environ: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """One message per RL_SANDBOX_* name in `environ` that is not in `known` (upper case),
    naming the closest valid setting."""
    valid = sorted({name.upper() for name in known if name.upper().startswith(ENV_PREFIX)})
    messages = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in valid:
            continue
        close = difflib.get_close_matches(upper, valid, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        messages.append(f"{name} is not a setting{hint}")
    return messages


class _RejectUnknownEnvironment(PydanticBaseSettingsSource):
    """A settings source that reads nothing and refuses unknown RL_SANDBOX_* variables."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        problems = unknown_settings(os.environ, setting_env_names())
        if problems:
            raise UnknownSettingError(
                "unknown settings in the environment (see sandbox_service/settings.py): "
                + "; ".join(problems)
            )
        return {}


class Settings(BaseSettings):
    """Every server setting, with its default; set any of them as RL_SANDBOX_<NAME>."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        use_attribute_docstrings=True,  # each field's docstring is its help (settings_help)
    )

    # --- request limits (API spec) ---
    max_code_bytes: int = Field(262144, ge=1)
    """Largest accepted `code`, in bytes."""
    max_timeout: float = Field(60.0, ge=0.001)
    """Largest accepted `timeout`, in seconds (every route refuses one under 0.001, the jail's
    floor: trainer_client.wire.MIN_TIMEOUT_S)."""
    max_memory_mb: int = Field(8192, ge=16)
    """Largest accepted `memory_mb`."""
    max_output_bytes: int = Field(65536, ge=1)
    """Cap on stdout and on stderr of each execution; the excess is discarded and flagged."""
    max_batch: int = Field(1024, ge=1)
    """Most requests in one /execute/batch."""
    max_files_bytes: int = Field(16 * 1024 * 1024, ge=0, le=32 * 1024 * 1024)
    """Largest total size of the input `files` of one request (decoded). At most 32 MiB: the
    request reaches the jail in one 64 MiB frame, its files in base64 next to a fetch list of
    up to 16 MiB (tests/unit/test_jail_protocol_bounds.py)."""
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Largest accepted HTTP body; larger bodies get 413."""
    max_stdin_bytes: int = Field(16 * 1024 * 1024, ge=0)
    """Largest accepted `stdin` (code-judge's `input`), in UTF-8 bytes."""
    max_input_files: int = Field(1024, ge=0)
    """Most entries in the `files` of one request."""
    max_path_bytes: int = Field(1024, ge=1, le=4096)
    """Longest path in `files` or `fetch_files`, in UTF-8 bytes (the wire models also refuse
    more than 1024 characters; the jail's protocol carries at most that)."""
    max_cells: int = Field(1024, ge=1)
    """Most cells in one SandboxFusion /run_jupyter request."""
    max_submissions: int = Field(65536, ge=1)
    """Most submissions in one code-judge batch (admitted max_batch at a time)."""
    api_key: str | None = None
    """When set, every endpoint but /healthz, /readyz and /metrics requires
    `Authorization: Bearer <api_key>`."""
    tenants_file: Path | None = None
    """TOML file of API keys, one `[[tenant]]` table each (`name`, `key`, optional `weight`,
    `max_in_flight`, `max_sessions`; tenants_file.py); with api_key too, that key is one more
    tenant, "default". Read by the API at start-up; the workers learn the names and weights
    from Redis, never the keys."""
    operator_key: str | None = None
    """The operator's key: `Authorization: Bearer <operator_key>` on `GET /metrics/tenants` gets
    every tenant's series (a tenant's key gets its own). It opens nothing else: it runs no code
    and is no tenant. It must differ from every tenant's key (the API refuses to start)."""

    # --- queue and admission ---
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("RL_SANDBOX_REDIS_URL", "REDIS_URL", "redis_url")
    )
    """Redis to use (also read from REDIS_URL); unset: `rl-sandbox up` starts a private one."""
    cells: str = ""
    """More cells for the API (comma-separated Redis URLs, each with its own workers), besides
    the cell of `redis_url`; empty: one cell. Read by the API only (api/cells.py); a worker
    belongs to the cell of its `redis_url`."""
    queue_name: str = "rl-sandbox"
    """Name of the RQ queue (and prefix of this service's Redis keys)."""
    max_queue_depth: int = Field(20000, ge=1)
    """Admission bound: requests that would push the queue past it get 429."""
    queue_deadline_s: float = Field(60.0, gt=0)
    """Work not started this long after admission is answered `queue_timeout`, never run."""
    result_ttl_s: int = Field(300, ge=1)
    """How long results stay in Redis."""
    retry_after_s: int = Field(1, ge=1)
    """Retry-After sent with 429."""
    poll_interval_s: float = Field(1.0, gt=0)
    """How often the API re-checks its outstanding jobs (lost notices, dead workers, deadlines)."""
    worker_heartbeat_s: float = Field(1.0, gt=0)
    """How often each worker reports itself alive."""
    worker_dead_after_s: float = Field(5.0, gt=0)
    """A worker silent this long is dead: its job is re-run once or answered sandbox_error."""
    client_response_margin_s: float = Field(120.0, gt=0)
    """The read margin clients add to a batch's largest program budget (trainer_client's
    Timeouts.response_margin_s): start-up refuses a queue deadline the API would outwait it by."""
    lost_job_retries: int = Field(1, ge=0)
    """How many times a job whose worker died is run again elsewhere before sandbox_error."""

    # --- workers and the jail ---
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    """Worker processes per host, each owning one executor slot."""
    executor_mode: ExecutorMode = "warm"
    """`warm`: fork from a preloaded jailed zygote; `cold`: a fresh nsjail per execution."""
    jail_start_timeout_s: float = Field(120.0, gt=0)
    """A jail whose zygote is not ready (preload included) this long after nsjail started has
    failed. The preload takes 2-4 s here (12 s at load 12 on 2 cores); emulated hosts (the
    cgroup v2 test guest) need minutes."""
    preload: Literal["math", "full"] = "math"
    """Warm mode: what the zygotes import before serving. `math`: numpy, sympy, mpmath, and
    pandas in the data zygote (the math and data tool calls' libraries; a program importing
    scipy or matplotlib pays that import, about 0.4 s, in its run). `full`: scipy, and
    matplotlib's pyplot in the data zygote: those programs save the import, every other call
    pays for a larger heap (docs/performance.md)."""
    lean_zygote: bool = True
    """Warm mode: each slot keeps a lean zygote (the standard library's common modules alone)
    beside the data one, for programs that import only the standard library (a static scan of
    their source), whose fork and exit then skip the data zygote's heap; about 22 MiB more per
    slot (docs/performance.md)."""
    math_zygote: bool = True
    """Warm mode, with `lean_zygote`: each slot keeps a third zygote, the math one (numpy, sympy,
    mpmath, no pandas), for programs that import only those and the standard library, whose
    fork and exit then skip pandas' mappings (about 1 ms of CPU a sympy call); about 67 MiB
    (PSS) more per slot; false: they fork from the data zygote (docs/performance.md)."""
    zygote_max_runs: int = Field(10_000, ge=1)
    """A warm zygote is recycled after this many executions (and after any anomaly). A jail's
    start (nsjail, the preload, its exercise) costs 1.2-1.4 s of CPU here: at 1,000 runs that
    was 1.2-1.4 ms of every call, a seventh of a warm `print(1)`."""
    idle_warm_up: Literal["auto", "always", "never"] = "auto"
    """Warm mode: while a slot is idle, ready a standby that has run typical sympy/numpy work
    (auto: only while fewer tasks than CPUs are runnable at that instant)."""
    default_max_processes: int = Field(64, ge=1)
    """Processes and threads one execution may have (cgroup pids)."""
    max_file_size_mb: int = Field(64, ge=1)
    """Largest file one execution may write."""
    workdir_size_mb: int = Field(256, ge=1)
    """Size of the private writable working directory (tmpfs)."""
    tmp_size_mb: int = Field(256, ge=1)
    """Size of the private /tmp (tmpfs)."""
    max_open_files: int = Field(256, ge=16)
    """Open file descriptors per process."""
    sandbox_uid_base: int = Field(62000, ge=1000)
    """Jailed programs run as outside uid sandbox_uid_base + slot index (never root), their
    zygotes as that + 100,000 (jail/policy.py: two principals)."""
    cgroup_parent: str = "rl-sandbox"
    """cgroup directory that holds the slots' cgroups: under each controller's root (v1), or under
    the unified root (v2), where the worker creates it and delegates memory, pids and cpu."""
    jail_python: str | None = None
    """Interpreter run inside the jail; default: the one running the worker."""
    slot_cpu_cores: float | None = Field(1.0, gt=0)
    """CPUs one slot's jail (or one session's jail) may use together, whatever its program
    forks (cgroup cpu controller); None: no limit. The API, Redis, heartbeats and the other
    slots keep their share."""
    max_fetch_files: int = Field(64, ge=0, le=4096)
    """Most paths one request's `fetch_files` may name (more: 422), so the most files one
    execution returns; together with max_path_bytes it bounds the fetch list the jail is sent
    (`max_fetch_list_bytes`)."""
    max_fetch_bytes: int = Field(16 << 20, ge=0, le=32 << 20)
    """Bytes (before base64) one execution may return through fetch_files, all files together."""
    memory_recycle_slack_mb: int = Field(64, ge=1)
    """A warm jail whose unreclaimable memory (anonymous + shared) stays this far above its
    post-preload baseline after a run's cleanup is replaced."""

    # --- sessions ---
    session_ttl_s: int = Field(1800, ge=1)
    """Idle sessions expire after this long."""
    max_sessions_per_worker: int = Field(16, ge=1)
    """Live sessions one worker holds, shared by tenant weight: a tenant's new session past its
    share on this worker evicts that tenant's own least recently used (rebuilt from its records
    when used); past its share of every live worker's slots, the API answers 429."""
    max_session_recorded_bytes: int = Field(64 << 20, ge=1)
    """Bytes of recorded cells (code, stdin, files) one session may hold, the prefix it shares
    with the session it was forked from included: a cell that would take it past is 422."""
    max_tenant_recorded_bytes: int = Field(1 << 30, ge=1)
    """Bytes of recorded cells one tenant's sessions may keep in Redis, a prefix shared by forks
    counted once: a session cell that would take it past is 429 until sessions end or expire."""
    max_grade_cases: int = Field(256, ge=1)
    """Most cases (tests) one POST /grade request may hold."""
    max_mcp_sessions: int = Field(10_000, ge=1)
    """Streamable-HTTP MCP sessions one API process keeps open (each until its DELETE or 30
    minutes idle); when tenants share the server, each may hold its weight's share (at least
    one): a tenant past its share is answered 429, never another tenant."""
    max_fork_n: int = Field(64, ge=1, le=1024)
    """Most sessions one POST /sessions/{id}/fork may make (its `n`)."""
    session_spares: int = Field(1, ge=0)
    """Session jails a worker keeps started ahead (once it has served a session), so that a new
    session does not wait for a jail's preload (~1 s); more absorb bursts of new sessions."""

    # --- compiled languages (language "cpp", "java") ---
    compile_timeout_s: float = Field(
        10.0,
        gt=0,
        le=120,
        validation_alias=AliasChoices(
            "RL_SANDBOX_COMPILE_TIMEOUT_S", "RL_SANDBOX_CPP_COMPILE_TIMEOUT_S", "compile_timeout_s"
        ),
    )
    """Wall-clock limit of g++ or javac compiling one program in the jail (SandboxFusion's
    default); a job's budget is its program's limit plus this. RL_SANDBOX_CPP_COMPILE_TIMEOUT_S,
    its name when only C++ compiled, is read too."""

    # --- drop-in compatibility (docs/compatibility.md) ---
    e2b_max_sandboxes: int = Field(1024, ge=1)
    """Live E2B sandboxes one tenant may hold; a create past it is 429 (E2B's own answer)."""
    codejudge_timeout_s: float = Field(10.0, ge=0.001)
    """Time limit of each code-judge submission: its MAX_EXECUTION_TIME (rStar2-Agent sets 4)."""
    codejudge_memory_mb: int = Field(384, ge=16)
    """Memory of each code-judge submission: its MAX_MEMORY (256 MB) plus its 128 MB headroom."""

    # --- HTTP server ---
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    shutdown_grace_s: float = Field(30.0, ge=0)
    """On SIGTERM, how long in-flight work may take to finish."""
    header_timeout_s: float = Field(10.0, gt=0)
    """A connection's request head (request line and headers) must arrive whole within this
    long of the connection, or of the request's first byte; else 408 and the connection is
    closed. It is what ends silent and half-sent connections, before the API key is read."""
    body_timeout_s: float = Field(60.0, gt=0)
    """A request's body must arrive whole within this long of its head (a total, not an idle
    time: at max_body_bytes' default, 64 MiB, a floor of about 1.1 MB/s); else 408 and close."""
    max_header_bytes: int = Field(65536, ge=1024)
    """Largest request head; a larger one is answered 431 and the connection closed."""
    max_connections: int = Field(8192, ge=1)
    """Connections one API process holds open; past it a new connection is closed at once.
    Start-up raises the process's open-file limit to fit, where the hard limit allows."""
    keep_alive_s: float = Field(30.0, gt=0)
    """An idle keep-alive connection is closed after this long."""
    send_timeout_s: float = Field(30.0, gt=0)
    """An answer's client must take it within this long, counted while the server waits on it
    (the connection's send buffer full): past it the connection is closed and the answer's
    memory freed. A total, not an idle time, as the read deadlines."""
    max_unread_answer_bytes: int = Field(256 << 20, ge=0)
    """Bytes of large answers (over 64 KiB) one API process holds for clients still reading
    them. Over it, a new call is refused 503 before it runs, and a large answer that would go
    over is replaced by a 503 (its result dropped; retry): never more held than this."""
    log_level: str = "INFO"
    """Level of the JSON-lines logs on stderr."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            _RejectUnknownEnvironment(settings_cls),
            init_settings,
            env_settings,
            dotenv_settings,
            file_secret_settings,
        )

    @model_validator(mode="after")
    def _heartbeats_fit(self) -> Settings:
        if self.worker_dead_after_s < 2 * self.worker_heartbeat_s:
            raise ValueError("worker_dead_after_s must be at least twice worker_heartbeat_s")
        return self

    @model_validator(mode="after")
    def _timeouts_nest(self) -> Settings:
        # The ladder (docs/service.md): program limit < job timeout < API wait < client read
        # timeout. The first two steps hold by construction; the last one is checked here, with
        # the margin clients add to a program's budget, so a client never gives up (and resends)
        # work the server is still going to answer.
        # A C++ program's compile comes on top of its timeout (jobs.JobPayload.compile_budget_s).
        server_beyond_program_s = self.api_wait_s(self.compile_timeout_s)
        if server_beyond_program_s >= self.client_response_margin_s:
            raise ValueError(
                f"the API waits up to {server_beyond_program_s:g} s beyond a program's timeout "
                "(queue_deadline_s + a C++ compile + job start and teardown + margin), "
                f"not less than client_response_margin_s ({self.client_response_margin_s:g} s): "
                "lower queue_deadline_s or compile_timeout_s, or raise the clients' "
                "Timeouts.response_margin_s and client_response_margin_s together"
            )
        return self

    def credentials(self) -> tuple[Credential, ...]:
        """The API keys and their tenants (none: an open server, every call tenant "default").

        `api_key` is tenant "default"; with a tenants file too, one more tenant besides the
        file's (which then may not name one "default" or reuse that key). Reads the file:
        TenantsFileError when it is not valid (the API checks it before it serves)."""
        found = self._keys()
        if self.operator_key is not None and any(
            c.key == self.operator_key.encode() for c in found
        ):
            raise TenantsFileError("operator_key must differ from every tenant's key")
        return found

    def _keys(self) -> tuple[Credential, ...]:
        single = single_key(self.api_key)
        if self.tenants_file is None:
            return single
        found = load_credentials(self.tenants_file)
        if single and any(
            c.tenant.name == DEFAULT_TENANT.name or c.key == single[0].key for c in found
        ):
            raise TenantsFileError(
                "api_key is tenant 'default': the tenants file must not name a tenant "
                "'default' nor give it the same key"
            )
        return single + found

    def cell_urls(self) -> tuple[str, ...]:
        """The Redis URL of each cell: `redis_url` first, then `cells`."""
        extra = tuple(url.strip() for url in self.cells.split(",") if url.strip())
        return ((self.redis_url,) if self.redis_url else ()) + extra

    def tenants(self) -> tuple[Tenant, ...]:
        """Every tenant the server serves (its fair share and queues), "default" when no file."""
        found = tuple(c.tenant for c in self.credentials())
        return found or (DEFAULT_TENANT,)

    def limits(self, timeout_s: float = 10.0, memory_mb: int = 1024) -> Limits:
        """The limits of one execution on this host: the request's time and memory, the host's
        caps for the rest."""
        return Limits(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_processes=self.default_max_processes,
            max_output_bytes=self.max_output_bytes,
            max_file_size_mb=self.max_file_size_mb,
            max_open_files=self.max_open_files,
        )

    def max_fetch_list_bytes(self) -> int:
        """Largest JSON encoding of an accepted `fetch_files` list (the jail's line and frame
        bounds must hold it): each path's byte may take six characters (`\\u0001`), plus quotes
        and separators."""
        return 2 + self.max_fetch_files * (6 * self.max_path_bytes + 4)

    def max_input_files_json_bytes(self) -> int:
        """Largest JSON encoding of an accepted `files` object as the jail is sent it (paths as
        above, contents in base64: 4 characters per 3 bytes, each file padded)."""
        contents = 4 * (self.max_files_bytes // 3) + 4 * self.max_input_files
        return 2 + contents + self.max_input_files * (6 * self.max_path_bytes + 6)

    def job_timeout_s(self, program_timeout_s: float) -> float:
        """How long a worker may hold one job: the program's limit plus jail start and teardown."""
        return program_timeout_s + 15.0

    def api_wait_s(self, program_timeout_s: float) -> float:
        """How long the API waits for a result before answering sandbox_error."""
        return self.queue_deadline_s + self.job_timeout_s(program_timeout_s) + 5.0


def setting_env_names() -> frozenset[str]:
    """Every environment variable the settings read: RL_SANDBOX_<FIELD> and explicit aliases."""
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(c).upper() for c in alias.choices if isinstance(c, str))
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{ENV_PREFIX}{name}".upper())
    return frozenset(names)


def settings_help() -> str:
    """Every setting as an environment variable with its default and its docstring (the help
    of `rl-sandbox up` and `api`)."""
    lines = [
        "settings (environment variables; defaults in sandbox_service/settings.py):",
    ]
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        lines.append(f"  {ENV_PREFIX}{name.upper()}={default!r}")
        if field.description:
            text = " ".join(field.description.split())
            lines.append(textwrap.fill(text, 96, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines) + "\n"
