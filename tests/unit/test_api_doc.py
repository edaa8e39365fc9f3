"""docs/api.md and the app's OpenAPI schema: the same routes, answer codes, models and fields."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sandbox_service.api.app import create_app
from sandbox_service.settings import Settings

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROUTE_HEADING = re.compile(r"^`(GET|POST|PUT|PATCH|DELETE) (/\S*)`$")
MODEL_HEADING = re.compile(r"^`(\w+)`$")
TABLE_KEY = re.compile(r"^\| `([^`]+)` \|", re.M)


def _sections(text: str, part: str) -> dict[str, str]:
    """`### heading` -> its text, within the `## part` of the page."""
    body = text.split(f"\n## {part}\n", 1)[1].split("\n## ", 1)[0]
    chunks = re.split(r"^### (.+)$", body, flags=re.M)[1:]
    return {chunks[i].strip(): chunks[i + 1] for i in range(0, len(chunks), 2)}


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    # The app never connects at construction; the URL is only for its settings' checks.
    schema: dict[str, Any] = create_app(Settings(redis_url="redis://127.0.0.1:1/0")).openapi()
    return schema


@pytest.fixture(scope="module")
def routes() -> dict[tuple[str, str], str]:
    out = {}
    for heading, text in _sections(API_DOC.read_text(), "Routes").items():
        match = ROUTE_HEADING.match(heading)
        assert match, f"a route heading is `METHOD /path`: {heading!r}"
        out[(match[1], match[2])] = text
    return out


@pytest.fixture(scope="module")
def models() -> dict[str, str]:
    out = {}
    for heading, text in _sections(API_DOC.read_text(), "Models").items():
        match = MODEL_HEADING.match(heading)
        assert match, f"a model heading is `Name`: {heading!r}"
        out[match[1]] = text
    return out


def _operations(openapi: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, methods in openapi["paths"].items()
        for method, operation in methods.items()
    }


def _ref(schema: dict[str, Any] | None) -> str | None:
    return None if schema is None or "$ref" not in schema else schema["$ref"].rsplit("/", 1)[-1]


def _json_schema(part: dict[str, Any]) -> dict[str, Any] | None:
    schema: dict[str, Any] | None = (
        part.get("content", {}).get("application/json", {}).get("schema")
    )
    return schema


def test_the_page_documents_exactly_the_routes_of_the_app(
    openapi: dict[str, Any], routes: dict[tuple[str, str], str]
) -> None:
    assert set(routes) == set(_operations(openapi))


def test_each_route_names_its_answer_codes_body_and_result_models(
    openapi: dict[str, Any], routes: dict[tuple[str, str], str]
) -> None:
    for route, operation in _operations(openapi).items():
        text = routes[route]
        answers = text.split("Answers:", 1)[1].split("Example:", 1)[0]
        assert set(re.findall(r"\b([1-5]\d\d)\b", answers)) == set(operation["responses"]), route
        body = _ref(_json_schema(operation.get("requestBody", {})))
        assert re.findall(r"Body:\s+`(\w+)`", text) == ([body] if body else []), route
        for code, response in operation["responses"].items():
            model = _ref(_json_schema(response))
            if model is not None:
                assert re.search(rf"\b{code}\s+\(?`{model}`", answers), (route, code, model)


def test_the_page_documents_exactly_the_models_of_the_schema(
    openapi: dict[str, Any], models: dict[str, str]
) -> None:
    assert set(models) == set(openapi["components"]["schemas"])


def test_each_model_table_lists_exactly_its_fields(
    openapi: dict[str, Any], models: dict[str, str]
) -> None:
    for name, schema in openapi["components"]["schemas"].items():
        documented = TABLE_KEY.findall(models[name])
        expected = schema["enum"] if "enum" in schema else list(schema["properties"])
        assert sorted(documented) == sorted(expected), name
        assert len(documented) == len(set(documented)), f"{name} lists a field twice"


def test_the_parser_reads_headings_and_table_keys_only() -> None:
    text = "\n## Models\n\n### `A`\n\n| field | x |\n|---|---|\n| `x` | `y` |\n\n## Next\n### `B`\n"
    sections = _sections(text, "Models")
    assert list(sections) == ["`A`"] and TABLE_KEY.findall(sections["`A`"]) == ["x"]
