"""The OpenAPI 3.1 document of ``conveyor serve``, served at ``/openapi.json``.

Written out rather than derived from models: the service checks values with the Python API's own
rules (``conveyor._limits``), and this document states the same limits (from the same constants)
so that clients and generators (schemathesis) see them.
"""

from __future__ import annotations

from typing import Any

from conveyor import __version__
from conveyor._admin import MAX_REPLAY_RATE, MIN_REPLAY_RATE
from conveyor._limits import INT32_MAX, INT32_MIN, MAX_ATTEMPTS, MAX_KEY_BYTES, MAX_NAME_CHARS, MAX_SECONDS
from conveyor._scaling import MAX_PROCESSES
from conveyor.http._parse import RFC3339_FORM

_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}
_KEY = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES, "description": f"1 to {MAX_KEY_BYTES} bytes"}
_SECONDS = {"type": "number", "minimum": 0, "maximum": MAX_SECONDS}
_TIME = {"type": "string", "format": "date-time", "description": f"RFC 3339: {RFC3339_FORM}"}
_UUID = {"type": "string", "format": "uuid"}
_SELECTION = {
    "ids": {"type": "array", "items": _UUID, "minItems": 1, "maxItems": 10000},
    "queue": _NAME,
    "task": _NAME,
    "error_type": {"type": "string"},
    "reason": {"type": "string", "minLength": 1, "maxLength": 2000},
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"description": description or "OK", "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Bad input: the message names the field",
        401: "No valid bearer token",
        403: "The token's role or queues do not allow this",
        404: "Not found (or not visible to this token)",
        409: (
            "The idempotency key is held by a job with a different task or payload (conflict), or by another "
            "transaction that has not committed yet (key_in_use: retry after Retry-After seconds)"
        ),
        413: "The body, a payload or the headers are over their size limit",
        429: "The queue is past its high-water mark: retry after Retry-After seconds",
        500: "The database is damaged (database_damaged): no retry helps until an operator repairs it",
        503: "The database cannot be reached: retry after Retry-After seconds",
    }
    out: dict[str, Any] = {}
    # Wherever the database can be away, it can be damaged.
    for code in sorted({*codes, *((500,) if 503 in codes else ())}):
        response = _json(_ref("Error"), text[code])
        if code in (429, 503):
            response["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
        out[str(code)] = response
    return out


_AUTH = (401, 403)


def _name_param(name: str) -> dict[str, Any]:
    """A name in the path: it may hold '/', percent-encoded (%2F) or not, the same name either way."""
    description = "may hold '/', written %2F or '/' (the same name)"
    return {"name": name, "in": "path", "required": True, "schema": _NAME, "description": description}


_QUEUE_PARAM = _name_param("queue")
_ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": _UUID}
_IDEMPOTENCY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": _KEY,
    "description": "Same as the body's idempotency_key: a retry with the same key enqueues nothing new.",
}

_JOB_PROPERTIES: dict[str, Any] = {
    "task": {**_NAME, "description": "The task name a worker runs"},
    "payload": {"type": "object", "description": "The handler's keyword arguments (JSON object, 256 KiB)"},
    "headers": {"type": "object"},
    "priority": {"type": "integer", "minimum": INT32_MIN, "maximum": INT32_MAX},
    "delay": {**_SECONDS, "description": "Seconds before the job may run (or run_at)"},
    "run_at": _TIME,
    "ttl": {**_SECONDS, "exclusiveMinimum": 0, "description": "Expire if not started within (or expires_at)"},
    "expires_at": _TIME,
    "idempotency_key": _KEY,
    "ordering_key": _KEY,
    "max_attempts": {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS},
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["status", "code", "message"],
                "properties": {
                    "status": {"type": "integer"},
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "field": {"type": "string"},
                },
            }
        },
    },
    "Scaling": {
        "type": "object",
        "required": ["desired", "current", "ready", "in_flight", "reason"],
        "properties": {
            "desired": {"type": "integer", "minimum": 1, "maximum": MAX_PROCESSES},
            "current": {"type": "integer", "minimum": 0},
            "ready": {"type": "integer", "minimum": 0},
            "in_flight": {"type": "integer", "minimum": 0},
            "reason": {"type": "string"},
        },
    },
    "NewJob": {
        "type": "object",
        "required": ["task"],
        "additionalProperties": False,
        "properties": _JOB_PROPERTIES,
    },
    "Accepted": {
        "type": "object",
        "required": ["id", "queue", "duplicate"],
        "properties": {
            "id": _UUID,
            "queue": {"type": "string"},
            "duplicate": {"type": "boolean", "description": "True: the key's job already existed"},
        },
    },
    "Batch": {
        "type": "object",
        "required": ["jobs"],
        "additionalProperties": False,
        "properties": {"jobs": {"type": "array", "minItems": 1, "maxItems": 1000, "items": _ref("NewJob")}},
    },
    "BatchAccepted": {
        "type": "object",
        "properties": {
            "jobs": {
                "type": "array",
                "items": {"type": "object", "properties": {"id": _UUID, "duplicate": {"type": "boolean"}}},
            }
        },
    },
    "Publish": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            name: _JOB_PROPERTIES[name]
            for name in ("payload", "headers", "priority", "delay", "run_at", "ttl", "expires_at", "idempotency_key")
        },
    },
    "JobStatus": {
        "type": "object",
        "properties": {
            "id": _UUID,
            "queue": {"type": "string"},
            "task": {"type": "string"},
            "state": {"enum": ["pending", "processing", "completed", "dead", "expired", "cancelled"]},
            "attempts": {"type": "integer"},
            "deliveries": {"type": "integer"},
            "payload": {"type": "object"},
            "headers": {"type": "object"},
            "result": {
                "description": "what the handler returned; null when it returned null, kept no result, has not "
                "completed, or when the stored result could not be read (then `unreadable.result` says why)"
            },
            "error": {"type": ["object", "null"]},
            "unreadable": {
                "type": "object",
                "properties": {name: {"type": "string"} for name in ("payload", "headers", "result")},
                "additionalProperties": False,
                "description": "what of the stored job is not JSON the service can read (another writer's or a "
                "hand edit's), by field, and why; empty when all of it is. An unreadable payload or headers read "
                'as {"unreadable": <why>}',
            },
        },
    },
    "Selection": {
        "type": "object",
        "required": ["reason"],
        "additionalProperties": False,
        "properties": _SELECTION,
        "description": "ids, or a queue (narrowed by task and error_type); never both",
    },
    "ReplaySelection": {
        "type": "object",
        "required": ["reason"],
        "additionalProperties": False,
        "properties": {
            **_SELECTION,
            "rate": {
                "type": "number",
                "minimum": MIN_REPLAY_RATE,
                "maximum": MAX_REPLAY_RATE,
                "description": "jobs per second (paced); a replay too slow for one request (over 20 s) is "
                "refused (400): use `conveyor dlq replay --rate`",
            },
        },
        "description": "ids, or a queue (narrowed by task and error_type); never both",
    },
    "NewToken": {
        "type": "object",
        "required": ["name", "role"],
        "additionalProperties": False,
        "properties": {
            "name": _NAME,
            "role": {"enum": ["producer", "operator", "admin"]},
            "queues": {"type": "array", "items": _NAME, "minItems": 1},
            "expires_in": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS},
        },
    },
}


def document(auth: bool = True) -> dict[str, Any]:
    """The OpenAPI document; ``auth`` False drops the bearer requirement (``--insecure-no-auth``)."""
    security: list[dict[str, list[str]]] = [{"bearer": []}] if auth else []
    sec = {"security": security}
    json_body = {"required": True, "content": {"application/json": {"schema": None}}}

    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {**json_body, "content": {"application/json": {"schema": schema}}}

    paths: dict[str, Any] = {
        "/healthz": {"get": {"summary": "The process answers", "security": [], "responses": {"200": _json({})}}},
        "/readyz": {
            "get": {
                "summary": "The database answers and its schema is current",
                "security": [],
                "responses": {"200": _json({}), **_errors(503)},
            }
        },
        "/v1/queues/{queue}/jobs": {
            "post": {
                "summary": "Enqueue one job (202 once committed; concurrent requests share a transaction)",
                "operationId": "send",
                **sec,
                "parameters": [_QUEUE_PARAM, _IDEMPOTENCY_HEADER],
                "requestBody": body(_ref("NewJob")),
                "responses": {
                    "202": {
                        **_json(_ref("Accepted"), "Accepted and committed"),
                        "headers": {"Location": {"schema": {"type": "string"}}},
                    },
                    **_errors(400, *_AUTH, 409, 413, 429, 503),
                },
            }
        },
        "/v1/queues/{queue}/jobs:batch": {
            "post": {
                "summary": "Enqueue up to 1,000 jobs in one transaction (all or none)",
                "operationId": "sendBatch",
                **sec,
                "parameters": [_QUEUE_PARAM],
                "requestBody": body(_ref("Batch")),
                "responses": {
                    "202": _json(_ref("BatchAccepted"), "Accepted and committed"),
                    **_errors(400, *_AUTH, 409, 413, 429, 503),
                },
            }
        },
        "/v1/jobs/{id}": {
            "get": {
                "summary": "A job's state, attempts, result or error (producers: the jobs they sent)",
                "operationId": "getJob",
                **sec,
                "parameters": [_ID_PARAM],
                "responses": {"200": _json(_ref("JobStatus")), **_errors(400, *_AUTH, 404, 503)},
            }
        },
        "/v1/topics/{topic}/messages": {
            "post": {
                "summary": "Publish: one job per matching subscription, in one transaction",
                "operationId": "publish",
                **sec,
                "parameters": [_name_param("topic"), _IDEMPOTENCY_HEADER],
                "requestBody": body(_ref("Publish")),
                "responses": {
                    "202": _json({"type": "object", "properties": {"jobs": {"type": "array", "items": _UUID}}}),
                    **_errors(400, *_AUTH, 409, 413, 503),
                },
            }
        },
        "/v1/queues": {
            "get": {
                "summary": "Counts per queue (operator)",
                "operationId": "queues",
                **sec,
                "responses": {"200": _json({"type": "object"}), **_errors(*_AUTH, 503)},
            }
        },
        **{
            f"{prefix}/{name}": {
                "get": {
                    "summary": summary,
                    "operationId": f"{name}{'Api' if prefix == '/api' else ''}",
                    **sec,
                    "responses": {"200": _json({"type": "object"}), **_errors(*_AUTH, 503)},
                }
            }
            for prefix in ("/v1", "/api")
            for name, summary in (
                ("workers", "Worker processes with their in-flight job ids (operator)"),
                ("alerts", "Alert states, firing and resolved (operator)"),
            )
        },
        "/v1/scaling": {
            "get": {
                "summary": "Worker processes the load of the queues asks for now, and why: a recommendation for an "
                "external autoscaler; no cool-downs (operator)",
                "operationId": "scaling",
                **sec,
                "parameters": [
                    {
                        "name": "queues",
                        "in": "query",
                        "schema": {"type": "string", "minLength": 1},
                        "description": "a,b (default: every queue)",
                    },
                    {
                        "name": "max",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PROCESSES},
                    },
                    {
                        "name": "min",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PROCESSES},
                    },
                    {
                        "name": "current",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_PROCESSES},
                    },
                    {
                        "name": "concurrency",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 10000},
                    },
                    {
                        "name": "target",
                        "in": "query",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,12}(\\.[0-9]{1,12})?$"},
                        "description": "jobs per process (default: concurrency)",
                    },
                    {
                        "name": "steps",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "step scaling: BACKLOG:ADD,... (e.g. 100:1,1000:2)",
                    },
                ],
                "responses": {"200": _json(_ref("Scaling")), **_errors(400, *_AUTH, 503)},
            }
        },
        "/v1/dead-letters": {
            "get": {
                "summary": "Unreplayed dead letters, newest first; page with before=next_before (operator)",
                "operationId": "deadLetters",
                **sec,
                "parameters": [
                    {"name": "queue", "in": "query", "schema": _NAME},
                    {"name": "task", "in": "query", "schema": _NAME},
                    {"name": "error_type", "in": "query", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    {"name": "before", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": _json({"type": "object"}), **_errors(400, *_AUTH, 503)},
            }
        },
        "/v1/dead-letters/{id}": {
            "get": {
                "summary": "One dead letter in full (operator)",
                "operationId": "deadLetter",
                **sec,
                "parameters": [_ID_PARAM],
                "responses": {"200": _json(_ref("JobStatus")), **_errors(400, *_AUTH, 404, 503)},
            }
        },
        "/v1/dead-letters:replay": {
            "post": {
                "summary": "Re-enqueue dead letters with fresh attempts (operator; audited)",
                "operationId": "replay",
                **sec,
                "requestBody": body(_ref("ReplaySelection")),
                "responses": {"200": _json({"type": "object"}), **_errors(400, *_AUTH, 413, 503)},
            }
        },
        "/v1/dead-letters:purge": {
            "post": {
                "summary": "Delete dead letters for good (admin; audited)",
                "operationId": "purge",
                **sec,
                "requestBody": body(_ref("Selection")),
                "responses": {"200": _json({"type": "object"}), **_errors(400, *_AUTH, 413, 503)},
            }
        },
        "/v1/audit": {
            "get": {
                "summary": "Operator actions, newest first (operator)",
                "operationId": "audit",
                **sec,
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10000}},
                    {
                        "name": "job",
                        "in": "query",
                        "description": "Only the actions naming this job (its replay, its purge)",
                        "schema": {"type": "string", "format": "uuid"},
                    },
                ],
                "responses": {"200": _json({"type": "object"}), **_errors(400, *_AUTH, 503)},
            }
        },
        "/v1/schedules": {
            "get": {
                "summary": "Every schedule with its next tick (operator)",
                "operationId": "schedules",
                **sec,
                "responses": {"200": _json({"type": "object"}), **_errors(*_AUTH, 503)},
            }
        },
        "/v1/schedules/{name}:pause": {
            "post": {
                "summary": "Stop firing a schedule (operator; audited)",
                "operationId": "pauseSchedule",
                **sec,
                "parameters": [_name_param("name")],
                "responses": {"200": _json({"type": "object"}), **_errors(400, *_AUTH, 404, 503)},
            }
        },
        "/v1/schedules/{name}:resume": {
            "post": {
                "summary": "Fire a paused schedule again from its next tick (operator; audited)",
                "operationId": "resumeSchedule",
                **sec,
                "parameters": [_name_param("name")],
                "responses": {"200": _json({"type": "object"}), **_errors(400, *_AUTH, 404, 503)},
            }
        },
        "/v1/tokens": {
            "get": {
                "summary": "Every token, never a secret (admin)",
                "operationId": "tokens",
                **sec,
                "responses": {"200": _json({"type": "object"}), **_errors(*_AUTH, 503)},
            },
            "post": {
                "summary": "Make a token; its bearer string is in this response only (admin; audited)",
                "operationId": "createToken",
                **sec,
                "requestBody": body(_ref("NewToken")),
                "responses": {"201": _json({"type": "object"}), **_errors(400, *_AUTH, 413, 503)},
            },
        },
        "/v1/tokens/{name}": {
            "delete": {
                "summary": "Revoke a token for good (admin; audited)",
                "operationId": "revokeToken",
                **sec,
                "parameters": [_name_param("name")],
                "responses": {"204": {"description": "Revoked"}, **_errors(400, *_AUTH, 404, 503)},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Conveyor",
            "version": __version__,
            "description": "A durable, at-least-once task queue on SQL: producers enqueue over HTTP, "
            "operators read queues and replay dead letters. Every error is JSON: {error: {status, code, "
            "message, field}}.",
        },
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "cvy_<id>_<secret>"}},
        },
    }
