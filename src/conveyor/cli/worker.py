"""``conveyor worker``: run worker processes for an App."""

from __future__ import annotations

import click

from conveyor._limits import preview
from conveyor.cli._common import FiniteFloat, fail, given_database, shared
from conveyor.worker import WorkerConfig
from conveyor.worker._config import MAX_WEIGHT


@click.command()
@click.argument("app_path", metavar="APP")
@click.option(
    "--queues",
    default=None,
    help="Lanes: a,b drains a before b; a:3,b:1 shares slots 3:1 (default: all declared queues).",
)
@click.option(
    "--processes", "-p", default=1, show_default=True, type=click.IntRange(1, 256), help="Worker processes (prefork)."
)
@click.option(
    "--concurrency",
    "-c",
    default=10,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Handler slots per process.",
)
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(0, 100_000),
    help="Leased jobs buffered per process (default: adaptive, 4 to 16 x concurrency; with --autoscale, 0). "
    "0: a job is leased only for a free slot.",
)
@click.option("--burst", is_flag=True, help="Drain the queues (scheduled retries included) and exit.")
@click.option(
    "--graceful-timeout",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds running handlers get to finish on SIGTERM.",
)
@click.option(
    "--visibility-timeout",
    default=30.0,
    show_default=True,
    type=float,
    help="Lease length of a fetched job before its task's own setting applies (seconds).",
)
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Serve Prometheus metrics on this port (with --processes P: ports PORT..PORT+P-1, one per process).",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics listen on (0.0.0.0: all)."
)
@click.option(
    "--pin",
    is_flag=True,
    help="Run each process on one CPU (Linux): much less CPU per job for def handlers waiting on I/O; "
    "costs the parallelism of handler code that releases the GIL.",
)
@click.option(
    "--autoscale",
    metavar="MIN:MAX",
    default=None,
    help="Grow and shrink the worker processes between MIN and MAX on the load of the queues "
    "(target tracking: one job per slot; see --scale-steps). Not with --processes or --burst.",
)
@click.option(
    "--scale-target",
    type=FiniteFloat(min=0, min_open=True),
    default=None,
    help="With --autoscale: jobs (ready + in flight) per process (default: --concurrency).",
)
@click.option(
    "--scale-steps",
    metavar="N:K,...",
    default=None,
    help="With --autoscale: step scaling instead: a backlog of N ready jobs or more adds K processes "
    "(e.g. 100:1,1000:2,10000:4); none matching and the jobs in flight fit in one fewer: one fewer.",
)
@click.option(
    "--scale-interval",
    type=FiniteFloat(min=0.05, max=3600),
    default=5.0,
    show_default=True,
    help="With --autoscale: seconds between two reads of the load.",
)
@click.option(
    "--scale-out-cooldown",
    type=FiniteFloat(min=0, max=86400),
    default=15.0,
    show_default=True,
    help="With --autoscale: seconds after a scale-out before the next one.",
)
@click.option(
    "--scale-in-cooldown",
    type=FiniteFloat(min=0, max=86400),
    default=60.0,
    show_default=True,
    help="With --autoscale: seconds the load must ask for fewer processes before one stops (one at a time).",
)
@click.pass_context
def worker(
    ctx: click.Context,
    app_path: str,
    queues: str | None,
    processes: int,
    concurrency: int,
    prefetch: int | None,
    burst: bool,
    graceful_timeout: float,
    visibility_timeout: float,
    metrics_port: int | None,
    metrics_host: str,
    pin: bool,
    autoscale: str | None,
    scale_target: float | None,
    scale_steps: str | None,
    scale_interval: float,
    scale_out_cooldown: float,
    scale_in_cooldown: float,
) -> None:
    """Run workers for APP (module:attribute, e.g. myproject.tasks:app)."""
    from conveyor._scaling import ScalingPolicy
    from conveyor.worker.supervisor import load_app, run_processes

    policy = None
    if autoscale is not None:
        if ctx.get_parameter_source("processes") not in (None, click.core.ParameterSource.DEFAULT):
            fail("--autoscale MIN:MAX sets the number of processes: give it or --processes, not both")
        if burst:
            fail("--autoscale cannot be combined with --burst (a burst drains its queues and exits)")
        policy = ScalingPolicy.parse(
            autoscale,
            steps=scale_steps,
            target=scale_target,
            scale_out_cooldown=scale_out_cooldown,
            scale_in_cooldown=scale_in_cooldown,
        )
    else:
        for name in ("scale_target", "scale_steps", "scale_interval", "scale_out_cooldown", "scale_in_cooldown"):
            if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT):
                fail(f"--{name.replace('_', '-')} needs --autoscale MIN:MAX")

    loaded = load_app(app_path)
    db = given_database(ctx, loaded)
    shared(loaded)
    lanes, weights = _lanes(queues)
    # Checked here, before any process is forked: a child that refuses its options would be restarted forever.
    config = WorkerConfig(
        queues=tuple(lanes) if lanes else None,
        weights=weights,
        concurrency=concurrency,
        prefetch=prefetch,
        burst=burst,
        graceful_timeout=graceful_timeout,
        visibility_timeout=visibility_timeout,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
    )
    ctx.exit(run_processes(app_path, db, processes, config, pin=pin, autoscale=policy, scale_interval=scale_interval))


def _lanes(text: str | None) -> tuple[list[str] | None, dict[str, int] | None]:
    """``a,b`` (strict order) or ``a:3,b:1`` (weighted) → (queues, weights)."""
    if text is None:
        return None, None
    queues: list[str] = []
    weights: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, weight = item.partition(":")
        if sep and name in weights:
            fail(f"--queues: queue {preview(name)} is given a weight twice")
        queues.append(name)
        if sep:
            # ASCII digits only: str.isdigit takes '²', which int() refuses, and '٣', which int() reads as 3.
            digits = weight.lstrip("0")
            if not (weight.isascii() and weight.isdigit()) or not digits:
                fail(f"--queues: weight of {preview(name)} must be a positive integer, got {preview(weight)}")
            # A weight past the limit is refused here by its length: int() refuses one of over 4,300 digits.
            if len(digits) > len(str(MAX_WEIGHT)):
                fail(f"--queues: weight of {preview(name)} must be between 1 and {MAX_WEIGHT:,}, got {preview(weight)}")
            weights[name] = int(digits)
    if not queues:
        fail(
            f"--queues {preview(text)} names no queue: leave the option out "
            "to drain every queue the app's tasks declare"
        )
    if weights and len(weights) != len(set(queues)):
        fail("--queues: give a weight to every queue (a:3,b:1) or to none (a,b)")
    return queues, weights or None
