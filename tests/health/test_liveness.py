"""Liveness judging with a fake probe standing in for the GPUs (the real probe runs in tests/gpu)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import NODE_BUNDLES

from gpucert.config.run import HealthConfig
from gpucert.hardware.inventory import bundle_sources, collect_inventory
from gpucert.health.liveness import LivenessError, LivenessResult
from gpucert.health.suite import run_liveness
from gpucert.status import Status

INVENTORY = collect_inventory(bundle_sources(NODE_BUNDLES / "h200x4"))
UUIDS = [gpu.uuid for gpu in INVENTORY.gpu.gpus]


class FakeProbe:
    def __init__(self, results: list[LivenessResult] | None = None, error: LivenessError | None = None):
        self.results, self.error = results or [], error

    def run(self, timeout_s: float) -> list[LivenessResult]:
        if self.error:
            raise self.error
        return self.results


def ok(index: int, digest: str = "abc") -> LivenessResult:
    return LivenessResult(index, UUIDS[index], True, 1.1e-6, digest, 3.0)


def statuses(results) -> dict:
    return {(r.gpu_index, r.name): r.status for r in results}


def test_all_gpus_correct_and_equal_pass() -> None:
    results = run_liveness(INVENTORY, HealthConfig(), FakeProbe([ok(i) for i in range(4)]))
    assert [r.status for r in results] == [Status.PASS] * 4
    assert [r.gpu_index for r in results] == [0, 1, 2, 3]


def test_a_wrong_result_fails_that_gpu_only() -> None:
    bad = LivenessResult(2, UUIDS[2], False, 0.5, "zzz", 3.0)
    results = run_liveness(INVENTORY, HealthConfig(), FakeProbe([ok(0), ok(1), bad, ok(3)]))
    assert [r.status for r in results] == [Status.PASS, Status.PASS, Status.FAIL, Status.PASS]
    assert "max relative error 5.00e-01 on GPU 2" in results[2].message


def test_the_gpu_whose_bits_differ_from_the_majority_fails_alone_and_named() -> None:
    results = run_liveness(INVENTORY, HealthConfig(), FakeProbe([ok(0), ok(1), ok(2), ok(3, digest="other")]))
    assert [r.status for r in results] == [Status.PASS, Status.PASS, Status.PASS, Status.FAIL]
    odd = results[3]
    assert odd.message.startswith(f"{INVENTORY.gpu.gpus[3].label} computed different bits (digest other) from the ")
    assert "the other 3 GPUs (digest abc)" in odd.message and "possible silent data corruption" in odd.message
    assert odd.details == {"digest": "other", "majority_digest": "abc"}
    assert "same bits as 2 other GPUs" in results[0].message


def test_a_plurality_is_not_a_majority() -> None:
    # Two of four agree, the other two differ from them and each other: more than half is needed to name a GPU.
    results = run_liveness(INVENTORY, HealthConfig(), FakeProbe([ok(0), ok(1, "x"), ok(2), ok(3, "y")]))
    assert all(r.status is Status.FAIL for r in results)
    assert "no result has a majority of the 4 GPUs: cannot tell which is wrong" in results[0].message


def test_gpus_that_disagree_with_no_majority_all_fail_naming_each_other() -> None:
    labels = [gpu.label for gpu in INVENTORY.gpu.gpus]
    results = run_liveness(INVENTORY, HealthConfig(), FakeProbe([ok(0), ok(1, digest="zzz")]))
    assert [r.status for r in results[:2]] == [Status.FAIL, Status.FAIL]
    assert f"from {labels[1]} for the same inputs" in results[0].message
    assert "no result has a majority of the 2 GPUs: cannot tell which is wrong" in results[0].message
    assert f"from {labels[0]} for the same inputs" in results[1].message


def test_a_wrong_gpu_does_not_vote() -> None:
    # GPU 2's result is wrong (it FAILs for that): the 3 correct GPUs agree, so none of them is blamed.
    bad = LivenessResult(2, UUIDS[2], False, 0.5, "zzz", 3.0)
    results = run_liveness(INVENTORY, HealthConfig(), FakeProbe([ok(0), ok(1), bad, ok(3)]))
    assert [r.status for r in results] == [Status.PASS, Status.PASS, Status.FAIL, Status.PASS]


def test_cuda_indices_are_matched_to_nvml_gpus_by_uuid() -> None:
    # CUDA may number GPUs differently from NVML (CUDA_DEVICE_ORDER): index 0 in CUDA is NVML's GPU 3 here.
    swapped = [LivenessResult(0, UUIDS[3], False, None, None, None, error="CUDA error: unspecified launch failure")]
    results = run_liveness(INVENTORY, HealthConfig(), FakeProbe(swapped))
    assert statuses(results) == {
        (0, "gpu.liveness"): Status.SKIP,
        (1, "gpu.liveness"): Status.SKIP,
        (2, "gpu.liveness"): Status.SKIP,
        (3, "gpu.liveness"): Status.FAIL,
    }
    assert "unspecified launch failure on GPU 3" in results[3].message


def test_a_hung_probe_fails_and_a_crashed_probe_is_an_error() -> None:
    (hung,) = run_liveness(INVENTORY, HealthConfig(), FakeProbe(error=LivenessError("no answer in 60 s", hung=True)))
    assert hung.status is Status.FAIL and "no answer in 60 s" in hung.message
    (crashed,) = run_liveness(INVENTORY, HealthConfig(), FakeProbe(error=LivenessError("No module named torch")))
    assert crashed.status is Status.ERROR


def test_turned_off_is_skip_never_pass(tmp_path: Path) -> None:
    (result,) = run_liveness(INVENTORY, HealthConfig(liveness=False), FakeProbe([ok(i) for i in range(4)]))
    assert result.status is Status.SKIP and "turned off" in result.message
