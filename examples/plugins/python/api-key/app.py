# Build (from this folder): componentize-py -d ../../../../wit -w api-key-stage componentize app -o api-key.wasm
"""api-key stage, "custom header": the key is read from one configured header (default
`x-aura-key`) and from `apikey`; `?apikey=` query keys are ignored. Configuration (TOML):

    header = "x-aura-key"   # lower-case header name
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.api_key import (
    Credential,
    KeyDecision,
    KeyDecision_Absent,
    KeyDecision_Present,
    KeyDecision_Refuse,
    KeyRequest,
    KeyRole,
    KeySource,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Plane

HEADER_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")

header = "x-aura-key"


def load(config: str) -> dict:
    try:
        value = json.loads(config) if config.strip() else {}
    except ValueError as e:
        raise Err(f"config: invalid JSON: {e}")
    if not isinstance(value, dict):
        raise Err("config: must be a table")
    return value


class ApiKey(exports.ApiKey):
    def configure(self, plane: Plane, config: str) -> list[str]:
        global header
        cfg = load(config)
        for key in cfg:
            if key != "header":
                raise Err(f"{key}: unknown key (expected header)")
        name = cfg.get("header", "x-aura-key")
        if not isinstance(name, str) or not name or not set(name) <= HEADER_CHARS:
            raise Err(f"header: {name!r} is not a lower-case header name")
        if name == "authorization":
            raise Err('header: "authorization" carries user JWTs, not API keys')
        header = name
        return [name] if name == "apikey" else [name, "apikey"]

    def extract(self, request: KeyRequest) -> KeyDecision:
        keys = []
        for name, value in request.headers:
            value = value.strip()
            if name in (header, "apikey") and value and value not in keys:
                keys.append(value)
        if not keys:
            log(Level.DEBUG, f"no API key on {request.path}")
            return KeyDecision_Absent()
        if len(keys) > 1:
            return KeyDecision_Refuse("two different API keys")
        return KeyDecision_Present(
            Credential(
                key=keys[0],
                source=KeySource.HEADER,
                allowed_roles=[KeyRole.ANON, KeyRole.SERVICE_ROLE],
            )
        )
