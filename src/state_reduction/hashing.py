"""The one config hash: what results, resumable runs (pretraining, RFT, S5) and data builds use to recognise a
configuration they have seen."""

from __future__ import annotations

import hashlib
import json


def config_key(config: dict, digits: int | None = 16) -> str:
    """sha256 of `config` as JSON with sorted keys (values JSON cannot hold, e.g. paths, written with str()), its
    first `digits` hex digits (all 64 for None). Result files store this as `config_key`; a change here would make
    every finished run look unfinished."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    return digest if digits is None else digest[:digits]
