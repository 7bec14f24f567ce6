"""``conveyor scale``: the worker processes the load asks for now, as a recommendation for an external
autoscaler (the same policy as ``conveyor worker --autoscale``, through ``app.admin.scaling``)."""

from __future__ import annotations

import click

from conveyor._scaling import ScalingPolicy
from conveyor.cli._common import FiniteFloat, app_of, dump, fail, settings


@click.command()
@click.argument("app_path", metavar="[APP]", required=False, default=None)
@click.option(
    "--queues", default=None, help="The worker's queues, a,b (default: APP's declared queues, else every queue)."
)
@click.option("--autoscale", metavar="MIN:MAX", required=True, help="The bounds, as for conveyor worker --autoscale.")
@click.option("--current", type=click.IntRange(0, 256), default=None, help="Processes running now (default: MIN).")
@click.option(
    "--concurrency", "-c", type=click.IntRange(1, 10_000), default=None, help="Slots per process (default 10)."
)
@click.option("--scale-target", type=FiniteFloat(min=0, min_open=True), default=None, help="Jobs per process.")
@click.option("--scale-steps", metavar="N:K,...", default=None, help="Step scaling (see conveyor worker --help).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def scale(
    ctx: click.Context,
    app_path: str | None,
    queues: str | None,
    autoscale: str,
    current: int | None,
    concurrency: int | None,
    scale_target: float | None,
    scale_steps: str | None,
    as_json: bool,
) -> None:
    """The number of worker processes the load of the queues asks for now, and why, in one line.

    Stateless: no cool-downs apply; the autoscaler that reads it (KEDA, an HPA, an ASG policy) applies its
    own stabilisation window. APP (module:attribute) is optional: it gives the queues its workers drain."""
    policy = ScalingPolicy.parse(autoscale, steps=scale_steps, target=scale_target)
    names: list[str] | None = None
    if queues is not None:
        names = [q.strip() for q in queues.split(",") if q.strip()]
        if not names:
            fail("--queues: give at least one queue name (a,b)")
    if app_path is not None:
        settings(ctx)["app_path"] = app_path
    app = app_of(ctx)
    if names is None and settings(ctx).get("app_path"):
        names = app.catalogue.declared_queues()
    decision = app.admin.scaling(policy, queues=names, current=current, concurrency=concurrency)
    if as_json:
        dump(decision.to_json())
        return
    click.echo(f"desired {decision.desired} (current {decision.current}): {decision.reason}")
