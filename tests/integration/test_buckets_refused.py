"""FerretDB 1 loses concurrent updates of one document: every path that could give it a ``buckets`` period refuses.

These tests run on FerretDB 1 servers (the session's ``ferretdb1`` fixture), whatever ``$FEED_TEST_BACKEND`` says:
the refusal is about that server.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from router import ClusterConfig, RouterConfig
from router.admin.migrate import discover, migrate_cluster
from router.admin.periods import plan_period
from router.admin.status import check_report
from router.cli import main
from router.errors import PeriodChangeRefused
from router.model import ClusterMeta
from router.storage.clusters import Cluster, Clusters
from harness.localservers import LocalClusters

from .conftest import NAMES, P1, P2, register


@pytest.fixture
def config(ferretdb1: LocalClusters) -> RouterConfig:
    return RouterConfig(database=f"t_{uuid.uuid4().hex[:12]}",
                        clusters=tuple(ClusterConfig(name=n, uri=u, options={}) for n, u in zip(NAMES, ferretdb1.uris)))


def test_ferretdb_is_refused_buckets(config: RouterConfig) -> None:
    """A period in buckets on FerretDB 1 is refused before anything is written, naming why."""
    with Clusters(config) as clusters, pytest.raises(PeriodChangeRefused, match="does not apply one document's filter"):
        plan_period(clusters, name="cluster_3", start=P2, layout="buckets")
    with Clusters(config) as clusters, pytest.raises(PeriodChangeRefused, match="cluster 'cluster_3': layout 'heap' is not one of"):
        plan_period(clusters, name="cluster_3", start=P2, layout="heap")


def test_check_names_a_buckets_period_on_ferretdb(config: RouterConfig) -> None:
    """A buckets period written onto FerretDB 1 behind the router's back is a problem `feedrouter check` names."""
    register(config)
    cluster = Cluster(config.clusters[2], config)
    try:
        cluster.write_meta(ClusterMeta(name="cluster_3", start_date=P2, creator_name="tests", layout="buckets"))
    finally:
        cluster.close()
    report, timemap = check_report(config)
    assert not report["ok"] and timemap is not None and timemap.layout_of("cluster_3") == "buckets"
    assert [p for p in report["problems"] if "layout" in p] == [
        p for p in report["problems"] if p.startswith("cluster 'cluster_3' cannot use layout 'buckets'")]
    assert len([p for p in report["problems"] if "layout" in p]) == 1


def test_scheduler_once_refuses_a_standby_that_cannot_keep_buckets(
    config: RouterConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`feedrouter scheduler --once` with `rollover.layout: buckets` and a FerretDB 1 standby fails at once (exit 1),
    naming the standby and why, weeks before the rollover window opens; with `layout: copies` the same standby is ready."""
    register(config, [(P1, None)])  # cluster_1 holds the open period; cluster_2 and cluster_3 are migrated standbys
    for spec in config.clusters[1:]:
        cluster = Cluster(spec, config)
        try:
            migrate_cluster(cluster, config, discover())
        finally:
            cluster.close()
    path = tmp_path / "clusters.yaml"
    clusters = "".join(f"  - {{name: {c.name}, uri: '{c.uri}'}}\n" for c in config.clusters)
    for layout, code in (("buckets", 1), ("copies", 0)):
        path.write_text(f"database: {config.database}\nclusters:\n{clusters}"
                        f"rollover: {{period: monthly, lead_time: 7d, standby: [cluster_2, cluster_3], layout: {layout}}}\n")
        assert main(["-c", str(path), "scheduler", "--once"]) == code
        out = capsys.readouterr().out
        if code:
            assert "no standby cluster is ready" in out
            for name in ("cluster_2", "cluster_3"):
                assert f"standby cluster {name!r} cannot use layout 'buckets'" in out and "(rollover.layout)" in out
        else:
            assert out.strip() == "ok"
