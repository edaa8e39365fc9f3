"""Validate KEDA objects against KEDA's CRD schema, as generated into cloudcoil-models-keda.

The models are pydantic classes generated from KEDA 2.16's CRDs; they ignore unknown fields, so
a field the model dropped on the way back out is reported as unknown (a typo would otherwise pass).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

KEDA_VERSION = "2.16"


def _unknown(given: Any, kept: Any, path: str) -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        out = []
        for key, value in given.items():
            if key not in kept:
                out.append(f"{path}/{key}: unknown field")
            else:
                out += _unknown(value, kept[key], f"{path}/{key}")
        return out
    if isinstance(given, list) and isinstance(kept, list):
        return [
            p
            for i, (g, k) in enumerate(zip(given, kept, strict=False))
            for p in _unknown(g, k, f"{path}/{i}")
        ]
    return []


def scaledobject_problems(obj: dict[str, Any]) -> list[str]:
    """Problems of a keda.sh object against the KEDA CRD models."""
    from cloudcoil.models.keda import v1alpha1

    if obj.get("apiVersion") != "keda.sh/v1alpha1" or obj.get("kind") != "ScaledObject":
        return [f"KEDA {KEDA_VERSION}: only keda.sh/v1alpha1 ScaledObject is checked here"]
    try:
        model = v1alpha1.ScaledObject.model_validate(obj)
    except ValidationError as exc:
        return [
            f"KEDA {KEDA_VERSION}: {'/'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
        ]
    kept = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return [f"KEDA {KEDA_VERSION}: {p}" for p in _unknown(obj, kept, "")]
