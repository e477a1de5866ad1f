"""The ``trtdeploy_serve`` fixture keeps servers for later tests, but not all of them: each holds its models' memory,
and a whole suite's would not fit in the memory of a CI machine."""

from __future__ import annotations

from pathlib import Path

from trtdeploy import Deployment
from trtdeploy.testing import ServedDeployments

from .helpers import write_deployment


def test_servers_of_earlier_modules_beyond_four_stop_the_one_asked_for_longest_ago(tmp_path: Path):
    deployments = [Deployment.load(write_deployment(tmp_path / f"dep{index}", "echo")) for index in range(6)]
    served = ServedDeployments()
    try:
        first = [served(deployment) for deployment in deployments[:3]]  # one module's
        assert served(deployments[0]) is first[0]  # kept, not started again; now the one asked for last
        served.next_module()
        later = [served(deployment) for deployment in deployments[3:]]  # the next module's: two of the first stop
        assert [server.poll() is None for server in first] == [True, False, False]
        assert all(server.poll() is None for server in later)
        again = served(deployments[1])  # asked for again: started again, in place of the earlier module's last one
        assert again is not first[1] and again.poll() is None and first[0].poll() is not None
        assert all(server.poll() is None for server in later)  # this module's are never the ones stopped
    finally:
        served.stop_all()
