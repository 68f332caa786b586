from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gpucert.config.floors import Floor, floor_for
from gpucert.config.loader import ConfigError
from gpucert.config.profiles import (
    GpuExpectations,
    NetworkExpectations,
    Profile,
    available_profiles,
    load_profile,
    profile_dir,
    select_profile,
)

BUILT_IN = ["a100-sxm", "cpu", "h100-pcie", "h100-sxm", "h200"]

# NVML device names as the driver reports them, and the profile each must select.
NVML_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-80GB": "a100-sxm",
    "NVIDIA A100-SXM4-40GB": "a100-sxm",
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(name_or_path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_profile(name_or_path)
    return str(info.value)


def no_profile_message(gpu: str) -> str:
    return (
        f"GPU {gpu!r} matches none of the built-in profiles; name one with --profile "
        f"({', '.join(available_profiles())}) or a profile YAML"
    )


def test_built_in_profiles_are_listed() -> None:
    names = available_profiles()
    assert set(BUILT_IN) <= set(names)
    assert names == sorted(names)


@pytest.mark.parametrize("name", available_profiles())
def test_every_built_in_profile_loads_under_its_own_name(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.description.strip() != ""
    assert profile.source == str(profile_dir() / f"{name}.yaml")
    for pattern in profile.match:
        re.compile(pattern)


def test_h100_sxm_thresholds_are_the_files_numbers() -> None:
    profile = load_profile("h100-sxm")
    assert profile.bf16_peak_tflops == 989.0
    assert profile.gpu == GpuExpectations(
        gpus_per_node=8,
        memory_gib_min=79.0,
        pcie_gen=5,
        pcie_width=16,
        nvlink_links=18,
        ecc_enabled=True,
        mig_enabled=False,
        persistence_mode=True,
        temperature_c_warn=80.0,
        temperature_c_fail=87.0,
        power_limit_w_min=690.0,
    )
    assert profile.software.driver_min == "535.104"
    assert profile.network == NetworkExpectations(ib_ports=None, ib_rate_gbps=None)


@pytest.mark.parametrize(("gpu", "expected"), sorted(NVML_NAMES.items()))
def test_select_profile_by_nvml_name(gpu: str, expected: str) -> None:
    assert select_profile([gpu]).name == expected


@pytest.mark.parametrize(("gpu", "expected"), sorted(NVML_NAMES.items()))
def test_each_nvml_name_matches_exactly_one_built_in_profile(gpu: str, expected: str) -> None:
    matching = [
        name
        for name in available_profiles()
        if any(re.search(pattern, gpu, re.IGNORECASE) for pattern in load_profile(name).match)
    ]
    assert matching == [expected]


def test_select_profile_ignores_case() -> None:
    assert select_profile(["nvidia h100 80gb hbm3"]).name == "h100-sxm"


def test_select_profile_judges_by_the_first_gpu() -> None:
    assert select_profile(["NVIDIA H200", "NVIDIA H200"]).name == "h200"


def test_no_gpus_selects_the_cpu_profile() -> None:
    profile = select_profile([])
    assert profile.name == "cpu"
    assert profile.gpu.gpus_per_node == 0
    assert profile.bf16_peak_tflops is None
    assert profile.match == []


@pytest.mark.parametrize("gpu", ["NVIDIA L40S", "NVIDIA H200 NVL", "NVIDIA H100 NVL", "NVIDIA A100 80GB PCIe"])
def test_unknown_gpu_names_the_gpu_and_lists_profiles(gpu: str) -> None:
    with pytest.raises(ConfigError) as info:
        select_profile([gpu])
    assert str(info.value) == no_profile_message(gpu)
    assert "a100-sxm, cpu, h100-pcie, h100-sxm, h200" in str(info.value)


def test_grace_hopper_is_not_taken_for_an_hgx_h200() -> None:
    with pytest.raises(ConfigError) as info:
        select_profile(["NVIDIA GH200 480GB"])
    assert str(info.value) == no_profile_message("NVIDIA GH200 480GB")


def test_unknown_profile_name_lists_the_built_ins() -> None:
    assert config_error("h900") == (
        f"unknown profile 'h900'; built-in profiles: {', '.join(available_profiles())} "
        "(or pass a path to a profile YAML)"
    )


def test_profile_path_that_does_not_exist_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    assert config_error(str(path)) == f"{path}: cannot read: No such file or directory"


# site profiles


def test_site_profile_extends_a_built_in_and_keeps_its_thresholds(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "site.yaml",
        "extends: h100-sxm\nname: site-h100\ndescription: our H100 nodes, 8 NDR ports\nnetwork:\n  ib_ports: 8\n",
    )
    base = load_profile("h100-sxm")
    site = load_profile(str(path))
    assert site == Profile(
        name="site-h100",
        description="our H100 nodes, 8 NDR ports",
        match=base.match,
        bf16_peak_tflops=989.0,
        gpu=base.gpu,
        software=base.software,
        network=NetworkExpectations(ib_ports=8, ib_rate_gbps=None),
        benchmarks=base.benchmarks,
        source=str(path),
    )
    assert site.gpu.gpus_per_node == 8
    assert site.gpu.temperature_c_fail == 87.0


def test_site_profile_overrides_one_nested_key_and_keeps_its_siblings(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: h200\nname: cool-h200\ngpu:\n  temperature_c_warn: 75\n")
    base = load_profile("h200")
    site = load_profile(str(path))
    assert site.gpu == dataclasses.replace(base.gpu, temperature_c_warn=75.0)
    assert site.description == base.description


def test_site_profile_can_extend_another_site_profile_by_relative_path(tmp_path: Path) -> None:
    write(tmp_path, "site.yaml", "extends: h100-sxm\nname: site\nnetwork:\n  ib_ports: 8\n")
    path = write(tmp_path, "rack7.yml", "extends: site.yaml\nname: rack7\nnetwork:\n  ib_rate_gbps: 400\n")
    rack = load_profile(str(path))
    assert rack.name == "rack7"
    assert rack.network == NetworkExpectations(ib_ports=8, ib_rate_gbps=400.0)
    assert rack.gpu == load_profile("h100-sxm").gpu
    assert rack.source == str(path)


def test_extends_loop_is_rejected(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "extends: b.yaml\nname: a\n")
    b = write(tmp_path, "b.yaml", "extends: a.yaml\nname: b\n")
    assert config_error(str(a)) == f"{a}: extends loops back on itself ({a} -> {b})"


def test_profile_extending_itself_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "self.yaml", "extends: self.yaml\nname: self\n")
    assert config_error(str(path)) == f"{path}: extends loops back on itself ({path})"


def test_extends_must_be_a_name_or_path(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: [h100-sxm]\nname: site\n")
    assert config_error(str(path)) == f"{path}: extends: expected a profile name or path, found ['h100-sxm']"


def test_extends_an_unknown_built_in_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: h900\nname: site\n")
    assert config_error(str(path)).startswith(f"{path}: extends: unknown profile 'h900'; built-in profiles: a100-sxm, ")


def test_bad_regex_in_match_is_rejected_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: h100-sxm\nname: site\nmatch: ['H100[', 'H100']\n")
    assert config_error(str(path)) == (
        f"{path}:3: match: 'H100[' is not a regular expression: unterminated character set at position 4"
    )


def test_unknown_top_level_key_in_profile_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: h100-sxm\nname: site\nthresholds: {}\n")
    assert config_error(str(path)) == (
        f"{path}:3: unknown key 'thresholds'; expected one of: "
        "benchmarks, bf16_peak_tflops, description, gpu, match, name, network, run_defaults, software, source"
    )


def test_unknown_nested_key_in_profile_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: h100-sxm\nname: site\nnetwork:\n  ib_port: 8\n")
    assert config_error(str(path)) == (
        f"{path}:4: unknown key 'network.ib_port'; expected one of: ib_ports, ib_rate_gbps"
    )


def test_wrong_type_in_profile_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: h100-sxm\nname: site\ngpu:\n  gpus_per_node: eight\n")
    assert config_error(str(path)) == f"{path}:4: gpu.gpus_per_node: expected int, found 'eight'"


def test_every_problem_of_a_site_profile_is_said_at_once_with_its_line(tmp_path: Path) -> None:
    """A wrong type hid the bad count keys and the unknown collective until it was fixed; those then came joined
    in one line with `; ` and no line."""
    text = "extends: h200\nname: s\nbenchmarks:\n  fs_write_gbps_min: fast\n  busbw_gbps_min:\n"
    text += "    all_reducee: {8: 300}\n    all_gather: {3x: 100}\nnetwork:\n  ib_ports: -1\n"
    path = write(tmp_path, "site.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_profile(str(path))
    assert [p.split(": ")[0] for p in caught.value.problems] == [
        f"{path}:4",  # fs_write_gbps_min: expected float
        f"{path}:5",  # unknown collective 'all_reducee', at busbw_gbps_min
        f"{path}:7",  # all_gather: '3x' is not a GPU count
        f"{path}:9",  # ib_ports must be >= 0
    ]


def test_standalone_profile_needs_a_description(tmp_path: Path) -> None:
    path = write(tmp_path, "bare.yaml", "name: bare\n")
    assert config_error(str(path)) == f"{path}: missing required key(s): description"


def test_a_profile_file_cannot_set_its_own_source(tmp_path: Path) -> None:
    path = write(tmp_path, "site.yaml", "extends: cpu\nname: site\nsource: /etc/elsewhere.yaml\n")
    assert load_profile(str(path)).source == str(path)


def test_a_node_mixing_gpu_models_must_name_its_profile() -> None:
    with pytest.raises(ConfigError, match=r"mixes GPU models .*NVIDIA H100 80GB HBM3, NVIDIA H200.*--profile"):
        select_profile(["NVIDIA H200", "NVIDIA H100 80GB HBM3"])


def test_an_empty_section_means_defaults(tmp_path: Path) -> None:
    from gpucert.config.loader import load_config
    from gpucert.config.run import HealthConfig, RunConfig

    path = write(tmp_path, "run.yaml", "health:\nprofile: h200\n")
    assert load_config(RunConfig, path).health == HealthConfig()


# floors per GPU count


def test_h200_busbw_floors_are_per_gpu_count() -> None:
    floors = load_profile("h200").benchmarks.busbw_gbps_min
    assert floors["all_gather"] == {"2": 260.0, "4": 305.0, "8": 305.0}
    assert floor_for(floors["all_gather"], 2, 1) == Floor(260.0, "2")
    assert floor_for(floors["all_gather"], 3, 1) is None  # no entry: shown, not judged
    assert floor_for(floors["all_reduce"], 8, 2) is None  # the fabric's floor is a site's to set
    assert floors["all_to_all"]["2"] == 300.0  # 0.9 x 335.8 measured on the lent 2xH200, 2026-11-22


def test_a_flat_floor_in_a_site_profile_still_reads_as_every_count(tmp_path: Path) -> None:
    path = write(
        tmp_path, "site.yaml", "extends: h200\nname: site\nbenchmarks:\n  busbw_gbps_min:\n    all_reduce: 350\n"
    )
    floors = load_profile(str(path)).benchmarks.busbw_gbps_min
    assert floors["all_reduce"] == 350.0
    for gpus, nodes in ((2, 1), (3, 1), (8, 1), (8, 4)):
        assert floor_for(floors["all_reduce"], gpus, nodes) == Floor(350.0, None)
    assert Floor(350.0).entry == "" and Floor(1.0, "2").entry == "[2 GPUs]" and Floor(1.0, "Nx8").entry == "[Nx8]"


def test_a_site_profile_adds_a_fabric_floor_and_keeps_the_node_floors(tmp_path: Path) -> None:
    text = "extends: h200\nname: site\nbenchmarks:\n  busbw_gbps_min:\n    all_reduce: {Nx8: 340, 2x8: 355}\n"
    floors = load_profile(str(write(tmp_path, "site.yaml", text))).benchmarks.busbw_gbps_min["all_reduce"]
    assert floors == {"2": 310.0, "4": 325.0, "8": 325.0, "Nx8": 340.0, "2x8": 355.0}
    assert floor_for(floors, 8, 2) == Floor(355.0, "2x8")
    assert floor_for(floors, 8, 16) == Floor(340.0, "Nx8")
    assert floor_for(floors, 4, 2) is None


@pytest.mark.parametrize(
    ("benchmarks", "problem"),
    [
        (
            "busbw_gbps_min: {all_reduce: {8GPU: 300}}",
            "benchmarks.busbw_gbps_min.all_reduce: key '8GPU' is not a GPU count: expected 'G' (G GPUs in one "
            "node, e.g. '8'), 'MxG' (M >= 2 nodes of G GPUs, e.g. '2x8') or 'NxG' (any nodes)",
        ),
        (
            "busbw_gbps_min: {all_reduce: {1x8: 300}}",
            "benchmarks.busbw_gbps_min.all_reduce: key '1x8' names one node: write '8' for 8 GPUs in one node",
        ),
        ("busbw_gbps_min: {all_reduce: {8: 0}}", "benchmarks.busbw_gbps_min.all_reduce.8 must be > 0, found 0"),
        ("busbw_gbps_min: {all_reduce: -1}", "benchmarks.busbw_gbps_min.all_reduce must be > 0, found -1"),
        (
            "busbw_gbps_min: {allreduce: 300}",
            "benchmarks.busbw_gbps_min: unknown collective 'allreduce'; expected any of all_reduce, all_gather, "
            "reduce_scatter, all_to_all, broadcast, send_recv",
        ),
        (
            "train_scaling_efficiency_min: {4: 85}",
            "benchmarks.train_scaling_efficiency_min.4 must be in (0, 1], found 85",
        ),
        ("train_scaling_efficiency_min: 0", "benchmarks.train_scaling_efficiency_min must be in (0, 1], found 0"),
    ],
)
def test_bad_count_floors_are_refused_at_load_naming_the_key(tmp_path: Path, benchmarks: str, problem: str) -> None:
    path = write(tmp_path, "site.yaml", f"extends: h200\nname: site\nbenchmarks:\n  {benchmarks}\n")
    assert config_error(str(path)) == f"{path}:4: {problem}"


def test_the_cpu_profile_judges_no_bandwidth_or_scaling() -> None:
    benchmarks = load_profile("cpu").benchmarks
    assert benchmarks.busbw_gbps_min == {} and benchmarks.train_scaling_efficiency_min is None


def test_a_site_profiles_negative_or_nan_values_are_refused_with_their_lines(tmp_path: Path) -> None:
    """`ib_ports: -1` read as "at least -1 active ports" and FAILed a node that has none."""
    path = tmp_path / "site.yaml"
    path.write_text(
        "name: s\ndescription: d\nextends: h100-sxm\nnetwork:\n  ib_ports: -1\ngpu: {temperature_c_warn: .nan}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_profile(str(path))
    assert caught.value.problems == [  # in the file's order
        f"{path}:5: network.ib_ports must be >= 0, found -1",
        f"{path}:6: gpu.temperature_c_warn must be >= 0, found nan",
    ]
