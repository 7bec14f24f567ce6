"""The chaos suite, short form (CI): real worker processes (plain and prefork) on a throwaway
PostgreSQL cluster behind a TCP proxy, a job mix, a bounded schedule of faults, and the checker
over the whole history (``_checker.py``): nothing lost, nothing stuck, every outcome as its policy
says, every extra handler run tied to an injected fault.

Two runs: infrastructure faults with well-behaved jobs, then hostile handlers (NUL text, SystemExit,
KeyboardInterrupt, ``os._exit``, a hung sync call) under a lighter set of faults. The long form is
``python -m bench.chaos`` (docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import mix_app as mix
from ._faults import Fault
from ._scenario import Scenario, run

#: Leases of 3 s: a killed or stopped worker's jobs come back within seconds, and a heartbeat
#: (every second) has two seconds of slack on a busy machine before a lease could expire unprovoked.
MIX = mix.MixConfig(visibility_timeout=3.0, fast_sleep=0.01, long_seconds=6.0, hang_seconds=20.0)

INFRASTRUCTURE = Scenario(
    name="infrastructure",
    upfront={mix.FAST: 600, mix.LONG: 12, mix.FLAKY: 30, mix.DOOMED: 10, mix.PERMANENT: 20},
    paced={mix.FAST: 2400, mix.LONG: 8},
    produce_seconds=28,
    faults=[
        Fault(3, "proxy_cut"),
        Fault(5, "kill_worker"),
        Fault(8, "pg_restart"),
        Fault(11, "stop_worker"),  # 7.5 s, past the 3 s leases
        Fault(19, "kill_child"),
        Fault(21, "proxy_cut"),
        Fault(23, "kill_tree"),
        Fault(26, "pg_restart"),
        Fault(29, "kill_worker"),
    ],
    mix=MIX,
    drain_timeout=90,
)

HOSTILE = Scenario(
    name="hostile",
    upfront={
        mix.FAST: 600,
        mix.LONG: 6,
        mix.FLAKY: 10,
        mix.PERMANENT: 10,
        mix.NUL_RESULT: 5,
        mix.NUL_ERROR: 5,
        mix.NUL_FLAKY: 5,
        mix.SYSTEM_EXIT: 5,
        mix.KEYBOARD: 5,
        mix.CRASH: 1,
        mix.HANG: 3,
    },
    paced={mix.FAST: 1500, mix.CRASH: 2, mix.SYSTEM_EXIT: 3, mix.NUL_RESULT: 3, mix.HANG: 1},
    produce_seconds=20,
    faults=[Fault(4, "kill_worker"), Fault(8, "pg_restart"), Fault(12, "proxy_cut"), Fault(14, "stop_worker")],
    mix=MIX,
    drain_timeout=90,
)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("scenario", [INFRASTRUCTURE, HOSTILE], ids=lambda s: s.name)
def test_chaos_run(scenario: Scenario, tmp_path: Path) -> None:
    report = run(scenario, tmp_path / scenario.name)
    print(report.format())
    print(report.format_throughput())
    # Every scheduled fault was injected ...
    assert report.fault_counts() == {
        kind: sum(1 for f in scenario.faults if f.kind == kind) for kind in {f.kind for f in scenario.faults}
    }
    # ... every accepted job was checked, and the promises held.
    assert report.accepted == sum(scenario.upfront.values()) + sum(scenario.paced.values())
    assert not scenario.bursts
    assert report.problems() == [], report.format()
