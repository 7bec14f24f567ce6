"""The queue contract: every queue's declared policy and every topic's subscriptions, as one document."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor._app import App
from conveyor._errors import printable as _p
from conveyor.backends.base import QueuesStatsParams, SubscriptionsListParams


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def build(app: App) -> dict[str, Any]:
    """The contract of ``app``: declared queues and tasks, plus queues, schedules and subscriptions
    found in the database (undeclared queues show the defaults)."""
    backend = app.backend
    subscriptions = backend.subscriptions_list(SubscriptionsListParams())
    schedules = backend.schedules_list()
    names = set(app.queues) | {t.options.queue for t in app.tasks.values()}
    names |= {s.queue for s in subscriptions} | {s.queue for s in schedules}
    names |= {s.queue for s in backend.queues_stats(QueuesStatsParams(datetime.now(UTC)))}
    queues: list[dict[str, Any]] = []
    for name in sorted(names):
        policy = app.queue_options(name)
        tasks = [t for t in app.tasks.values() if t.options.queue == name]
        queues.append(
            {
                "queue": name,
                "declared": name in app.queues,
                "dedup_window_s": _seconds(policy.dedup_window),
                "ordering": "per-key FIFO (ordering_key)" if policy.ordered else "priority, run_at, enqueue order",
                "max_depth": policy.max_depth,
                "shedding": dict(policy.shedding) if policy.max_depth else None,
                "sla_s": _seconds(policy.sla),
                "retention_s": _seconds(policy.retention),
                "dead_retention_s": _seconds(policy.dead_retention),
                "on_expire": policy.on_expire,
                "concurrency": policy.concurrency,
                "tasks": [
                    {
                        "task": t.name,
                        "visibility_timeout_s": t.options.visibility_timeout,
                        "max_attempts": t.options.max_attempts,
                        "max_deliveries": t.options.deliveries_limit,
                        "backoff": t.options.backoff.describe(),
                        "dead_on": [e.__name__ for e in t.options.dead_on],
                        "timeout_s": t.options.timeout,
                        "ack_policy": t.options.ack_policy,
                        "keep_result": t.options.keep_result,
                        "priority": t.options.priority,
                        "version": t.options.version,
                    }
                    for t in sorted(tasks, key=lambda t: t.name)
                ],
                "schedules": [
                    {
                        "name": s.name,
                        "cron": s.cron,
                        "task": s.task,
                        "paused": s.paused,
                        "next_run_at": s.next_run_at.isoformat(),
                    }
                    for s in schedules
                    if s.queue == name
                ],
            }
        )
    topics: dict[str, list[dict[str, Any]]] = {}
    for sub in subscriptions:
        topics.setdefault(sub.topic, []).append(
            {"queue": sub.queue, "task": sub.task, "filter": json.loads(sub.filter)}
        )
    return {
        "database": backend.engine,
        "queues": queues,
        "topics": [{"topic": t, "subscriptions": subs} for t, subs in sorted(topics.items())],
    }


def render(contract: dict[str, Any], fmt: str) -> str:
    """Render as ``json``, ``yaml`` or ``md``."""
    if fmt == "json":
        return json.dumps(contract, indent=2)
    if fmt == "yaml":
        return "\n".join(_yaml(contract, 0)) + "\n"
    return _markdown(contract)


def _yaml(value: Any, indent: int) -> list[str]:
    # JSON scalars are valid YAML scalars, so this small emitter only has to lay out the structure.
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml(item, indent + 1))
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
    elif isinstance(value, list):
        for item in value:
            sub = _yaml(item, indent + 1)
            if isinstance(item, (dict, list)) and sub:
                lines.append(f"{pad}- {sub[0].strip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
    else:
        lines.append(f"{pad}{json.dumps(value)}")
    return lines


def _markdown(contract: dict[str, Any]) -> str:
    """Markdown for a terminal or a file: every name escaped where a terminal would act on it (an ESC
    in a queue name, a bidi override), as the JSON and YAML renderings escape them."""
    out = [f"# Queue contract ({_p(contract['database'])})", ""]
    for q in contract["queues"]:
        out.append(f"## Queue `{_p(q['queue'])}`" + ("" if q["declared"] else " (not declared: defaults)"))
        out.append("")
        out.append("| policy | value |")
        out.append("| --- | --- |")
        for key in (
            "ordering",
            "dedup_window_s",
            "max_depth",
            "shedding",
            "sla_s",
            "retention_s",
            "dead_retention_s",
            "on_expire",
            "concurrency",
        ):
            value = q[key]
            out.append(f"| {key} | {'-' if value is None else value} |")
        out.append("")
        if q["tasks"]:
            out.append(
                "| task | visibility timeout (s) | attempts | deliveries | backoff | dead on | timeout (s) | ack |"
            )
            out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
            for t in q["tasks"]:
                dead_on = _p(", ".join(t["dead_on"]))
                out.append(
                    f"| `{_p(t['task'])}` | {t['visibility_timeout_s']} | {t['max_attempts']} | "
                    f"{t['max_deliveries']} | {t['backoff']} | {dead_on} | {t['timeout_s'] or '-'} | "
                    f"{t['ack_policy']} |"
                )
            out.append("")
        for s in q["schedules"]:
            state = "paused" if s["paused"] else f"next {s['next_run_at']}"
            out.append(f"- schedule `{_p(s['name'])}`: `{_p(s['cron'])}` → `{_p(s['task'])}` ({state})")
        if q["schedules"]:
            out.append("")
    if contract["topics"]:
        out.append("## Topics")
        out.append("")
        for t in contract["topics"]:
            for sub in t["subscriptions"]:
                where = f"queue `{_p(sub['queue'])}` task `{_p(sub['task'])}`"
                out.append(f"- `{_p(t['topic'])}` → {where} filter `{json.dumps(sub['filter'])}`")
        out.append("")
    return "\n".join(out)
