"""The `slurm_cluster` fixture: one real two-node Slurm cluster for the whole session, stopped at its end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.slurm import SlurmCluster, SlurmSetupError, reason_cannot_install, start_cluster, stop_cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Installs Debian's slurm packages if missing, starts munged, slurmctld and slurmd `node1` and `node2`,
    and yields once both nodes are idle. Pass `slurm_cluster.env` to every subprocess that uses the cluster.
    Skipped only where it cannot run at all (not root, or no Slurm and no apt-get)."""
    reason = reason_cannot_install()
    if reason is not None:
        pytest.skip(reason)
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmSetupError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
