"""The E2B code interpreter's wire (e2b >= 2.6, e2b-code-interpreter >= 2.9) onto ours (pure).

A sandbox is a record (owner tenant, timeout, contexts) and one session of ours: its jail holds
the files `sandbox.files` writes, the commands `sandbox.commands` runs, and one interpreter whose
namespaces are its code contexts. Requests arrive on one port: the control plane (`/sandboxes`,
`/v2/sandboxes`, authenticated by `X-API-KEY`) and the data plane, which the SDK marks with
`E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers (49999: the code interpreter's Jupyter server,
49983: envd) and authenticates with the sandbox's access token (`X-Access-Token`, or
`E2B-Traffic-Access-Token`, which the SDK also sends to `/contexts`).

    SDK call                    request                          here
    Sandbox.create              POST /v2/sandboxes (/sandboxes)  201 record, a token; no session yet
    kill / set_timeout          DELETE /sandboxes/{id}, POST .../timeout   204; 404 unknown
    get_info / list / connect   GET /sandboxes/{id}, GET /v2/sandboxes, POST .../connect
    run_code                    POST /execute (49999)            a cell of the sandbox's session
                                                                 in the context's namespace,
                                                                 streamed as JSON lines
    *_code_context              /contexts (49999)                a namespace per context
    files.write / files.read    POST / GET /files (49983)        a cell with files / fetch_files
    files.list, commands.* ...  POST /filesystem.Filesystem/*,   envd's Connect RPC: cells that
                                POST /process.Process/*          run e2b_inside.py (e2b_rpc.py)
    is_running                  GET /health (49983)              204 while the record lives

This module holds the routing, the keys and the control plane; e2b_interpreter.py the code
interpreter's and envd's files' mapping, e2b_envd.py envd's Connect RPC.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

JUPYTER_PORT = 49999
ENVD_PORT = 49983
ENVD_VERSION = "0.5.7"
"""The envd version reported: >= 0.4.0 drops the SDK's `username` and Basic header, >= 0.5.7 lets
it upload file-like data as octet-stream (served too), < 0.6.2 keeps file metadata off."""
DEFAULT_TEMPLATE = "code-interpreter-v1"
TEMPLATES = frozenset({DEFAULT_TEMPLATE, "code-interpreter", "base"})
"""Template names answered; all are this server's one Python runtime."""
DEFAULT_CONTEXT = "default"
"""The context `run_code` uses without `context=`; its session also holds `sandbox.files`."""
HOME = "/home/user"
"""E2B's home and working directory; its paths map onto the session's working directory."""
JAIL_ROOTS = ("/tmp", "/mnt")
"""Other writable directories of the jail that E2B paths may name as they are."""
KEEPALIVE_S = 5.0
"""Seconds between keepalive lines while a cell runs (E2B's own interval)."""
DEFAULT_TIMEOUT_S = 300
"""A sandbox's life when create names none (the SDK's default_sandbox_timeout)."""
CLIENT_ID = "rl-sandbox"
CPU_COUNT = 1
LANGUAGES = frozenset({"python", "python3"})
MAX_CONTEXTS = 16
"""Code contexts one sandbox may hold besides its default one."""
MAX_METADATA_ITEMS = 64
MAX_ENV_VARS = 256
MAX_TEXT_CHARS = 4096
SANDBOX_ID = re.compile(r"[a-z0-9]{8,64}")
CONTEXT_ID = re.compile(r"[A-Za-z0-9_]{1,64}")
_HOST = re.compile(r"(\d{1,5})-([a-z0-9]{8,64})\.")


@dataclass(frozen=True, slots=True)
class ApiError:
    """A refusal in E2B's shape: the status and `{"code", "message"}` (the SDK keeps `message`)."""

    code: int
    message: str

    def body(self) -> bytes:
        """The JSON body the SDK reads."""
        return json.dumps({"code": self.code, "message": self.message}).encode()


# --- routing and keys ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A data-plane request: the sandbox it names and the port (service) it is for."""

    sandbox_id: str
    port: int


def target_of(path: str, headers: Mapping[bytes, bytes]) -> Target | None:
    """The data-plane target of a request: the SDK's headers, else a `<port>-<id>.` Host (E2B's
    host routing, for a proxy that serves `*.<domain>`); None for any other request, and for
    the control plane's paths, which some SDK versions call with the sandbox's headers too."""
    if is_control_path(path):
        return None
    sandbox_id = headers.get(b"e2b-sandbox-id")
    if sandbox_id is not None:
        port = headers.get(b"e2b-sandbox-port", str(ENVD_PORT).encode())
        ident = sandbox_id.decode("latin-1")
        return Target(ident, int(port) if port.isdigit() and len(port) <= 5 else 0)
    host = headers.get(b"host", b"").decode("latin-1")
    found = _HOST.match(host)
    if found is None:
        return None
    return Target(found.group(2), int(found.group(1)))


def is_control_path(path: str) -> bool:
    """Whether `path` is one of the control plane's (`/sandboxes...`, `/v2/sandboxes...`)."""
    return path.startswith(("/sandboxes", "/v2/sandboxes")) and (
        path in ("/sandboxes", "/v2/sandboxes")
        or path.startswith(("/sandboxes/", "/v2/sandboxes/"))
    )


def api_key_of(presented: bytes) -> bytes:
    """Our API key from an `X-API-KEY`: `e2b_<hex of the key>` (the shape e2b 2.24 to 2.62
    insists on) decodes to the key; any other value is the key itself."""
    if presented.startswith(b"e2b_"):
        try:
            return bytes.fromhex(presented[4:].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            return presented
    return presented


def e2b_key_for(api_key: str) -> str:
    """The `E2B_API_KEY` that stands for our `api_key` and passes the SDK's `e2b_<hex>` check."""
    return "e2b_" + api_key.encode().hex()


def new_sandbox_id() -> str:
    """A fresh sandbox id: 20 random lowercase hex digits (no `-`, so host routing parses it)."""
    return secrets.token_hex(10)


def new_token() -> str:
    """A sandbox's access token: the data plane's credential (the SDK sends no API key there)."""
    return secrets.token_hex(24)


# --- the control plane --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewSandbox:
    """A validated `POST /sandboxes` body."""

    template_id: str
    timeout_s: int
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """One live sandbox, as kept in Redis."""

    sandbox_id: str
    tenant: str
    template_id: str
    access_token: str
    started_at: float
    end_at: float
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The stored JSON."""
        return json.dumps(
            {
                "id": self.sandbox_id,
                "tenant": self.tenant,
                "template": self.template_id,
                "token": self.access_token,
                "started": self.started_at,
                "end": self.end_at,
                "metadata": self.metadata,
                "env": self.env_vars,
            }
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> SandboxRecord:
        """Inverse of to_json."""
        data = json.loads(raw)
        return cls(
            sandbox_id=data["id"],
            tenant=data["tenant"],
            template_id=data["template"],
            access_token=data["token"],
            started_at=float(data["started"]),
            end_at=float(data["end"]),
            metadata=dict(data.get("metadata", {})),
            env_vars=dict(data.get("env", {})),
        )

    def with_timeout(self, now: float, timeout_s: int) -> SandboxRecord:
        """The record whose end is `timeout_s` from now (E2B's set_timeout and connect)."""
        return replace(self, end_at=now + timeout_s)


def json_object(raw: bytes) -> dict[str, Any] | ApiError:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return ApiError(400, "the body is not valid JSON")
    if not isinstance(body, dict):
        return ApiError(400, "the body must be a JSON object")
    return body


def _timeout(value: object, default: int, max_timeout_s: int) -> int | ApiError:
    """E2B's timeout in seconds, clamped to the server's most (a session's state lives
    `session_ttl_s` after its last cell; a sandbox may not promise longer)."""
    if value is None:
        return min(default, max_timeout_s)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ApiError(400, "timeout must be a number of seconds")
    if isinstance(value, float) and not math.isfinite(value):  # an int of any size compares
        return ApiError(400, "timeout must be a number of seconds")
    if value < 0:
        return ApiError(400, "timeout must not be negative")
    return max(1, min(int(value), max_timeout_s))


def string_map(value: object, what: str, max_items: int) -> dict[str, str] | ApiError:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > max_items:
        return ApiError(400, f"{what} must be an object of at most {max_items} strings")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > MAX_TEXT_CHARS or len(item) > MAX_TEXT_CHARS:
            return ApiError(400, f"{what}[{key[:64]!r}] must be a string under {MAX_TEXT_CHARS}")
        if "\x00" in key or "\x00" in item or not encodable(key + item):
            return ApiError(400, f"{what}[{key[:64]!r}] is not valid text")
    return dict(value)


def encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_new_sandbox(raw: bytes, max_timeout_s: int) -> NewSandbox | ApiError:
    """The sandbox a create body asks for (unknown fields are ignored, as E2B's API does)."""
    body = json_object(raw)
    if isinstance(body, ApiError):
        return body
    template = body.get("templateID", DEFAULT_TEMPLATE)
    if not isinstance(template, str):
        return ApiError(400, "templateID must be a string")
    if template not in TEMPLATES:
        served = ", ".join(sorted(TEMPLATES))
        return ApiError(404, f"template '{template[:64]}' not found; this server has {served}")
    timeout = _timeout(body.get("timeout"), DEFAULT_TIMEOUT_S, max_timeout_s)
    if isinstance(timeout, ApiError):
        return timeout
    metadata = string_map(body.get("metadata"), "metadata", MAX_METADATA_ITEMS)
    if isinstance(metadata, ApiError):
        return metadata
    env_vars = string_map(body.get("envVars"), "envVars", MAX_ENV_VARS)
    if isinstance(env_vars, ApiError):
        return env_vars
    if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in env_vars):
        return ApiError(400, "envVars names must be identifiers")
    return NewSandbox(template, timeout, metadata, env_vars)


def parse_timeout(raw: bytes, max_timeout_s: int, default: int | None = None) -> int | ApiError:
    """The seconds of a `POST /sandboxes/{id}/timeout` (or `/connect`) body."""
    body = json_object(raw)
    if isinstance(body, ApiError):
        return body
    if "timeout" not in body and default is None:
        return ApiError(400, "timeout is required")
    return _timeout(body.get("timeout"), default or 0, max_timeout_s)


def created_body(record: SandboxRecord) -> dict[str, Any]:
    """The 201 body of create (and of connect) that the SDK parses."""
    return {
        "templateID": record.template_id,
        "sandboxID": record.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": record.access_token,
        "trafficAccessToken": record.access_token,
        "domain": None,
    }


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


def listed_body(record: SandboxRecord, memory_mb: int) -> dict[str, Any]:
    """One sandbox of `GET /v2/sandboxes` (and, with the token, of `GET /sandboxes/{id}`)."""
    return {
        "templateID": record.template_id,
        "sandboxID": record.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": _iso(record.started_at),
        "endAt": _iso(record.end_at),
        "cpuCount": CPU_COUNT,
        "memoryMB": memory_mb,
        "diskSizeMB": 0,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": record.metadata,
    }


def detail_body(record: SandboxRecord, memory_mb: int) -> dict[str, Any]:
    """The body of `GET /sandboxes/{id}`."""
    return {**listed_body(record, memory_mb), "envdAccessToken": record.access_token}


def metadata_filter(query: str) -> dict[str, str]:
    """The `metadata` query of a list call (`k1=v1&k2=v2`, URL-encoded once more by the SDK)."""
    return dict(parse_qsl(query, keep_blank_values=True))
