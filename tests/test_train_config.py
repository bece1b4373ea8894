from pathlib import Path

import pytest

from turngym.config import apply_overrides, from_dict, load_yaml
from turngym.train import TrainConfig
from turngym.trainers.archer import ArcherConfig
from turngym.trainers.pg import PGConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_quickstart_yaml_is_the_default_train_config():
    assert load_yaml(TrainConfig, CONFIGS / "quickstart.yaml") == TrainConfig()


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_bundled_config_loads(path):
    load_yaml(TrainConfig, path)


def test_unknown_keys_are_errors_that_name_the_valid_ones():
    with pytest.raises(ValueError, match="unknown config key.*'iteratons'.*valid keys"):
        from_dict(TrainConfig, {"archer": {"iteratons": 3}})
    with pytest.raises(ValueError, match="no field 'lrr'"):
        apply_overrides(TrainConfig(), ["sft.lrr=1"])


def test_nested_sections_override_field_by_field():
    cfg = from_dict(TrainConfig, {"archer": {"iterations": 2}})
    assert cfg.archer.iterations == 2 and cfg.archer.trainable == TrainConfig().archer.trainable
    cfg = apply_overrides(TrainConfig(), ["algo=gigpo", "pg.group_size=2", "env_kwargs={tool_format: hermes}"])
    assert cfg.pg.algo == "gigpo" and cfg.pg.group_size == 2 and cfg.env_kwargs == {"tool_format": "hermes"}


def test_cross_field_checks_fail_fast():
    with pytest.raises(ValueError, match="group_size"):
        PGConfig(algo="grpo", group_size=1)
    with pytest.raises(ValueError, match="multiple of group_size"):
        PGConfig(episodes_per_iter=10, group_size=4)
    with pytest.raises(ValueError, match="tau"):
        ArcherConfig(tau=0.0)
    with pytest.raises(ValueError, match="algo"):
        TrainConfig(algo="ppo")


def test_number_fields_accept_yaml_spellings():
    from turngym.config import apply_overrides
    from turngym.train import TrainConfig

    cfg = apply_overrides(TrainConfig(), ["pg.actor_lr=1e-4", "archer.gamma=1", "archer.max_turns=12",
                                          "archer.iterations=3.0"])
    assert cfg.pg.actor_lr == 1e-4 and isinstance(cfg.pg.actor_lr, float)
    assert cfg.archer.gamma == 1.0 and isinstance(cfg.archer.gamma, float)
    assert cfg.archer.max_turns == 12 and cfg.archer.iterations == 3 and isinstance(cfg.archer.iterations, int)
    with pytest.raises(ValueError, match="expected a number"):
        apply_overrides(TrainConfig(), ["pg.actor_lr=fast"])


def test_autocast_auto_uses_bf16_only_where_the_hardware_has_it():
    import torch

    from turngym.trainers.actor import use_bf16

    assert use_bf16("bf16", "cpu") and not use_bf16("none", "cuda") and use_bf16("auto", "cuda")
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert use_bf16("auto", "cpu") == native  # an AVX2-only CPU emulates bf16, far slower than fp32
    assert PGConfig().autocast == "auto" and ArcherConfig().autocast == "auto"


def test_each_algo_trains_with_its_own_section():
    from turngym.train import rl_section
    from turngym.trainers.registry import get_algorithm

    assert TrainConfig().algo == "branch_bc"
    for algo, section, trainer in (("archer", "archer", "ArcherTrainer"), ("rloo", "pg", "PGTrainer"),
                                   ("filtered_bc", "pg", "PGTrainer"), ("branch_bc", "branch", "BranchBCTrainer")):
        cfg = apply_overrides(TrainConfig(), [f"algo={algo}"])
        name, sub = rl_section(cfg)
        assert name == section and sub is getattr(cfg, section) and get_algorithm(algo).trainer.__name__ == trainer


def test_every_algorithm_is_registered_and_named_in_the_help():
    import argparse

    from turngym.train import add_arguments
    from turngym.trainers.registry import algorithm_names

    names = algorithm_names()
    assert sorted(names) == ["archer", "branch_bc", "filtered_bc", "gigpo", "grpo", "reinforce", "rloo"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    help_text = p.format_help()
    assert all(n in help_text for n in names)
    assert all(n in TrainConfig.__dataclass_fields__["algo"].metadata["help"] for n in names)
    with pytest.raises(ValueError, match="unknown algorithm"):
        apply_overrides(TrainConfig(), ["algo=ppo"])


def test_unknown_and_unused_knobs_are_errors():
    # branch BC's config holds only its own knobs: the online trainers' sampling knobs are unknown to it
    with pytest.raises(ValueError, match="no field 'temperature'"):
        apply_overrides(TrainConfig(), ["branch.temperature=0.7"])
    with pytest.raises(ValueError, match="unknown config key"):
        from_dict(TrainConfig, {"branch": {"async_staleness": 0}})
    # a critic-free knob only another algorithm reads
    with pytest.raises(ValueError, match="does not use"):
        PGConfig(algo="rloo", group_size=2, step_weight=0.5)
    with pytest.raises(ValueError, match="does not use"):
        PGConfig(algo="gigpo", group_size=2, bc_top_k=2)
    assert PGConfig(algo="gigpo", group_size=2, step_weight=0.5).step_weight == 0.5
    # switching the quickstart's filtered-BC section to another algorithm drops what it does not read
    cfg = apply_overrides(TrainConfig(), ["algo=grpo"])
    assert cfg.pg.algo == "grpo" and cfg.pg.expert_replay == 0
