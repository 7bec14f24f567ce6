"""The fault injector's tools do what the chaos runs rely on: the proxy's cut really breaks the
connections through it (and only those, once), an immediate restart keeps every committed insert
(so a job the checker finds missing was lost by Conveyor, not by the server), and the vacuum blocker
really holds back vacuum."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from ._cluster import ChaosCluster, VacuumBlocker
from ._proxy import TcpProxy


@pytest.fixture(scope="module")
def cluster() -> Iterator[ChaosCluster]:
    with ChaosCluster() as c:
        yield c


def test_proxy_cut_breaks_connections_through_it(cluster: ChaosCluster) -> None:
    with TcpProxy("127.0.0.1", cluster.port) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
        with psycopg.connect(url, autocommit=True) as via, psycopg.connect(cluster.url, autocommit=True) as direct:
            assert via.execute("SELECT 1").fetchone() == (1,)
            assert proxy.open_connections == 1
            assert proxy.cut() == 1
            with pytest.raises(psycopg.OperationalError):
                via.execute("SELECT 1")
            assert direct.execute("SELECT 1").fetchone() == (1,)  # not through the proxy: untouched
        with psycopg.connect(url, autocommit=True) as again:  # new connections go through at once
            assert again.execute("SELECT 2").fetchone() == (2,)
        assert proxy.connections_total == 2


def test_proxy_closes_clients_while_the_server_is_down() -> None:
    with ChaosCluster() as down:
        port = down.port
    with TcpProxy("127.0.0.1", port) as proxy, pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres", connect_timeout=3)


def test_immediate_restart_keeps_committed_inserts(cluster: ChaosCluster) -> None:
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept SELECT generate_series(1, 1000)")
    cluster.restart_immediate()
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (1000,)
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        conn.execute("DROP TABLE kept")


def test_vacuum_blocker_holds_back_vacuum(cluster: ChaosCluster) -> None:
    url = cluster.create_database("blocked")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE jobs (n int) WITH (autovacuum_enabled = off)")
        blocker = VacuumBlocker(url)
        blocker.start()
        try:
            conn.execute("INSERT INTO jobs SELECT generate_series(1, 1000)")
            conn.execute("DELETE FROM jobs")
            conn.execute("VACUUM jobs")
            dead = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
            assert dead == (1000,)  # the deleted rows are still visible to the blocker's snapshot
        finally:
            blocker.release()
        assert blocker.error is None
        conn.execute("VACUUM jobs")
        dead = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
        assert dead == (0,)
