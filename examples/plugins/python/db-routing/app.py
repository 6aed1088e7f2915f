# Build (from this folder): componentize-py -d ../../../../wit -w db-routing-stage componentize app -o db-routing.wasm
"""db-routing stage, "reads to PostgREST": reads of dedicated Postgres projects go straight to
their database — a `GET` or `HEAD` to a read replica in the client's region when the project
has one, else to its PostgREST — and everything else over NATS. The decision depends on the
method, the path, the project and the client's region: that is what it declares.
Configuration (TOML):

    postgrest_methods = ["GET", "HEAD"]   # upper-case methods sent to PostgREST
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.db_routing import (
    DbCache,
    DbEngine,
    DbInputs,
    DbRequest,
    DbRoute,
    DbRoute_Nats,
    DbRoute_Postgrest,
    DbRoute_Replica,
    DbRoute_Unresolved,
    Topology,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Method, Plane

NATS_ONLY = ("/v1/db/schema", "/v1/db/policies", "/v1/db/sql")
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# The JSON Schema of the configuration, checked by the gateway before `configure` runs.
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "db-routing: reads to PostgREST",
    "type": "object",
    "properties": {
        "postgrest_methods": {
            "description": "Methods sent to PostgREST (a GET or HEAD may go to a replica instead).",
            "type": "array",
            "items": {"enum": METHODS},
            "uniqueItems": True,
            "default": ["GET", "HEAD"],
        }
    },
    "additionalProperties": False,
}
# How long a decision holds: a function of its declared inputs, so as long as the gateway keeps it.
MAX_AGE_MS = 300_000

postgrest_methods: list[Method] = [Method.GET, Method.HEAD]


def load(config: str) -> dict:
    try:
        value = json.loads(config) if config.strip() else {}
    except ValueError as e:
        raise Err(f"config: invalid JSON: {e}")
    if not isinstance(value, dict):
        raise Err("config: must be a table")
    return value


class DbRouting(exports.DbRouting):
    def config_schema(self) -> str | None:
        return json.dumps(SCHEMA)

    def configure(self, plane: Plane, config: str) -> DbCache | None:
        global postgrest_methods
        cfg = load(config)
        for key in cfg:
            if key != "postgrest_methods":
                raise Err(f"{key}: unknown key (expected postgrest_methods)")
        value = cfg.get("postgrest_methods", ["GET", "HEAD"])
        if not isinstance(value, list):
            raise Err("postgrest_methods: must be a list of upper-case methods")
        for m in value:
            if m not in METHODS:
                raise Err(f"postgrest_methods: {m!r} is not a known method")
        postgrest_methods = [Method[m] for m in value]
        inputs = DbInputs.METHOD | DbInputs.PATH | DbInputs.PROJECT | DbInputs.CLIENT_REGION
        return DbCache(inputs=inputs, max_age_ms=MAX_AGE_MS)

    def decide(self, request: DbRequest) -> DbRoute:
        project = request.project
        if request.path.startswith(NATS_ONLY) or project is None:
            return DbRoute_Nats()
        if project.engine == DbEngine.MONGODB or project.topology == Topology.SHARED:
            return DbRoute_Nats()
        if request.method not in postgrest_methods:
            return DbRoute_Nats()
        # The gateway sends only GET and HEAD to a replica, and only to one of the project's.
        if request.method in (Method.GET, Method.HEAD) and request.client_region is not None:
            for replica in project.replicas:
                if replica.region == request.client_region:
                    return DbRoute_Replica(replica.url)
        if project.postgrest_url is not None:
            return DbRoute_Postgrest(project.postgrest_url)
        log(Level.WARN, f"no PostgREST target for {request.path}")
        return DbRoute_Unresolved()
