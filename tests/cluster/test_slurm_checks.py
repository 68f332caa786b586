"""What `gpucert health --drain` tells Slurm, on results and on `scontrol` answers (the real daemons take these
same paths in test_slurm_cluster.py)."""

from __future__ import annotations

from gpucert.cluster.slurm_checks import REASON_CHARS, apply_drain, drain_reason
from gpucert.report.schema import Result
from gpucert.status import Status


def result(name: str, status: Status, message: str = "m") -> Result:
    return Result(name=name, subject="gpu07 GPU 3", status=status, message=message)


def test_only_a_fail_drains_and_the_reason_is_one_short_line_naming_the_check() -> None:
    assert drain_reason([result("gpu.idle", Status.WARN), result("gpu.liveness", Status.ERROR)]) is None
    long = "expected 0 uncorrectable ECC errors,\nfound 12 " + "x" * 400
    reason = drain_reason([result("gpu.ecc", Status.FAIL, long), result("gpu.xid", Status.FAIL)])
    assert reason is not None and reason.startswith("gpucert: gpu.ecc gpu07 GPU 3: expected 0 uncorrectable ECC")
    assert "\n" not in reason and len(reason) <= REASON_CHARS and reason.endswith("... (+1 more)")


class Scontrol:
    """Answers as scontrol gave them on the test cluster; records what it was asked."""

    def __init__(self, node_line: str = "", fail: str | None = None) -> None:
        self.node_line, self.fail, self.asked = node_line, fail, []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[str | None, str | None]:
        self.asked.append(argv)
        if self.fail is not None:
            return None, self.fail
        return (self.node_line if argv[1] == "show" else ""), None


def test_a_fail_drains_a_pass_resumes_only_a_drain_of_gpucerts_own() -> None:
    ask = Scontrol()
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, ask)
    assert ok and said.startswith("drained gpu07: gpucert: gpu.ecc")
    assert ask.asked == [
        ["scontrol", "update", "NodeName=gpu07", "State=DRAIN", "Reason=gpucert: gpu.ecc gpu07 GPU 3: m"]
    ]
    ours = (
        "NodeName=gpu07 Arch=x86_64 State=IDLE+DRAIN Partitions=gpu "
        "Reason=gpucert: gpu.ecc gpu07 GPU 3: m [root@2026-11-22T19:40:01]"
    )
    ask = Scontrol(ours)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.PASS)], 5.0, ask)
    assert ok and said.startswith("resumed gpu07") and ask.asked[-1][-1] == "State=RESUME"
    theirs = ours.replace("gpucert: gpu.ecc gpu07 GPU 3: m", "cable swap")
    ask = Scontrol(theirs)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.PASS)], 5.0, ask)
    assert ok and "drained by someone else: cable swap" in said and len(ask.asked) == 1


def test_a_drain_scontrol_refuses_is_reported_as_not_done() -> None:
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, Scontrol(fail="Invalid node name"))
    assert not ok and said == "could not drain gpu07: Invalid node name"
