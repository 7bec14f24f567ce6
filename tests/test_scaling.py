"""The autoscaling policy (``conveyor._scaling``): pure decisions on a fixed clock."""

from __future__ import annotations

import math

import pytest

from conveyor import ConfigurationError
from conveyor._scaling import ScalingState, parse_bounds, parse_steps
from conveyor.admin import ScalingPolicy


def decide(policy: ScalingPolicy, ready: int, in_flight: int, current: int, now: float, state: ScalingState):  # type: ignore[no-untyped-def]
    return policy.decide(ready=ready, in_flight=in_flight, current=current, concurrency=10, now=now, state=state)


def test_target_tracking_is_load_over_slots_clamped() -> None:
    policy = ScalingPolicy(1, 8)
    assert policy.decide(ready=0, in_flight=0, current=3, concurrency=10).desired == 1
    assert policy.decide(ready=25, in_flight=10, current=1, concurrency=10).desired == 4  # ceil(35 / 10)
    assert policy.decide(ready=30, in_flight=0, current=1, concurrency=10).desired == 3
    assert policy.decide(ready=10_000, in_flight=0, current=1, concurrency=10).desired == 8
    assert ScalingPolicy(2, 8).decide(ready=0, in_flight=0, current=2, concurrency=10).desired == 2
    # A target of its own instead of the slots; scheduled jobs are never an input.
    decision = ScalingPolicy(1, 8, target=2.5).decide(ready=5, in_flight=1, current=1, concurrency=10)
    assert (decision.desired, decision.ready, decision.in_flight) == (3, 5, 1)
    assert "6 jobs at 2.5 per process want 3" in decision.reason
    assert "\n" not in decision.reason


def test_scale_out_is_at_once_then_waits_for_its_cooldown() -> None:
    policy = ScalingPolicy(1, 8, scale_out_cooldown=15, scale_in_cooldown=60)
    d = decide(policy, 30, 0, 1, 100.0, ScalingState())
    assert d.desired == 3 and d.state.last_scale_out == 100.0
    d = decide(policy, 80, 0, 3, 110.0, d.state)
    assert d.desired == 3 and "scale-out cool-down" in d.reason
    d = decide(policy, 80, 0, 3, 115.0, d.state)
    assert d.desired == 8 and d.state.last_scale_out == 115.0


def test_scale_in_waits_for_the_cooldown_then_goes_one_at_a_time() -> None:
    policy = ScalingPolicy(1, 8, scale_out_cooldown=15, scale_in_cooldown=60)
    state = ScalingState(last_scale_out=0.0)
    d = decide(policy, 0, 0, 4, 100.0, state)
    assert d.desired == 4 and d.state.fewer_since == 100.0
    d = decide(policy, 0, 0, 4, 159.0, d.state)
    assert d.desired == 4
    d = decide(policy, 0, 0, 4, 160.0, d.state)
    assert d.desired == 3 and d.state.last_scale_in == 160.0  # one, not all the way to 1
    d = decide(policy, 0, 0, 3, 200.0, d.state)
    assert d.desired == 3  # the wait starts again after each step
    d = decide(policy, 0, 0, 3, 220.0, d.state)
    assert d.desired == 2
    # A load that stops asking for fewer resets the wait.
    d = decide(policy, 20, 0, 2, 230.0, d.state)
    assert d.desired == 2 and d.state.fewer_since is None
    d = decide(policy, 0, 0, 2, 240.0, d.state)
    assert d.desired == 2 and d.state.fewer_since == 240.0


def test_never_below_min_nor_above_max_even_in_cooldowns() -> None:
    policy = ScalingPolicy(2, 3, scale_out_cooldown=1000, scale_in_cooldown=1000)
    busy = ScalingState(last_scale_out=0.0, fewer_since=0.0)
    assert decide(policy, 0, 0, 0, 1.0, busy).desired == 2  # a supervisor that just started
    assert decide(policy, 0, 0, 5, 1.0, busy).desired == 3
    assert decide(policy, 0, 0, 2, 5000.0, ScalingState(fewer_since=0.0)).desired == 2


def test_steps_add_the_largest_matching_step_and_remove_one_when_in_flight_fits() -> None:
    policy = ScalingPolicy(1, 10, steps=parse_steps("1000:2, 100:1,10000:4"), scale_out_cooldown=0, scale_in_cooldown=0)
    assert policy.steps == ((100, 1), (1000, 2), (10000, 4))
    assert policy.decide(ready=99, in_flight=0, current=2, concurrency=10).desired == 1
    assert policy.decide(ready=100, in_flight=0, current=2, concurrency=10).desired == 3
    assert policy.decide(ready=5000, in_flight=0, current=2, concurrency=10).desired == 4
    assert policy.decide(ready=50_000, in_flight=0, current=8, concurrency=10).desired == 10
    # No step matches: one fewer only when the jobs in flight fit in one process fewer.
    assert policy.decide(ready=50, in_flight=20, current=3, concurrency=10).desired == 2
    assert policy.decide(ready=50, in_flight=21, current=3, concurrency=10).desired == 3
    assert policy.decide(ready=0, in_flight=0, current=1, concurrency=10).desired == 1
    # With memory: the scale-in cool-down and one at a time apply to steps too.
    slow = ScalingPolicy(1, 10, steps=((100, 1),), scale_in_cooldown=30)
    d = decide(slow, 0, 0, 4, 0.0, ScalingState())
    assert d.desired == 4
    d = decide(slow, 0, 0, 4, 30.0, d.state)
    assert d.desired == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"minimum": 3, "maximum": 2}, "minimum 3 is above its maximum 2"),
        ({"minimum": 0, "maximum": 2}, "minimum must be from 1 to 256"),
        ({"minimum": -1, "maximum": 2}, "minimum must be from 1 to 256"),
        ({"minimum": 1, "maximum": 257}, "maximum must be from 1 to 256"),
        ({"minimum": 1.5, "maximum": 2}, "minimum must be an integer"),
        ({"minimum": True, "maximum": 2}, "minimum must be an integer"),
        ({"minimum": 1, "maximum": 2, "target": math.nan}, "scale target must be a finite number"),
        ({"minimum": 1, "maximum": 2, "target": math.inf}, "scale target must be a finite number"),
        ({"minimum": 1, "maximum": 2, "target": 0}, "scale target must be above 0"),
        ({"minimum": 1, "maximum": 2, "scale_in_cooldown": -1}, "scale in cooldown must be at least 0"),
        ({"minimum": 1, "maximum": 2, "scale_out_cooldown": math.nan}, "scale out cooldown must be a finite"),
        ({"minimum": 1, "maximum": 2, "steps": ((0, 1),)}, "a backlog is 1 to"),
        ({"minimum": 1, "maximum": 2, "steps": ((10, 0),)}, "a backlog is 1 to"),
        ({"minimum": 1, "maximum": 2, "steps": ((10, 1), (10, 2))}, "backlog 10 is given twice"),
        ({"minimum": 1, "maximum": 2, "steps": ((10, 1),), "target": 3}, "not both"),
    ],
)
def test_bad_numbers_are_refused_in_one_line(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ScalingPolicy(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["", "3", "1:", ":3", "a:b", "1:2:3", "-1:3", "1.5:3", "1:3\x00", "1:" + "9" * 50])
def test_bad_bounds_are_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="autoscale must be MIN:MAX"):
        parse_bounds(text)


@pytest.mark.parametrize("text", ["", ",", "100", "100:", "100:x", "1e3:1", "100:1;1000:2", "100:-1"])
def test_bad_steps_are_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="scale steps"):
        parse_steps(text)


def test_bad_loads_are_refused() -> None:
    policy = ScalingPolicy(1, 3)
    for kwargs in ({"ready": -1}, {"in_flight": -1}, {"concurrency": 0}, {"current": -1}, {"ready": 1.5}):
        args: dict[str, object] = {"ready": 0, "in_flight": 0, "current": 1, "concurrency": 10, **kwargs}
        with pytest.raises(ConfigurationError):
            policy.decide(**args)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="now must be a finite"):
        policy.decide(ready=0, in_flight=0, current=1, concurrency=1, now=math.nan, state=ScalingState())
