"""Fused projections (`model.fuse_projections`, finetune/model/fused.py): q/k/v and gate/up as one frozen GEMM and one
adapter down-projection give PEFT's outputs and gradients, on the three architectures the recipes train
(Qwen2, Mistral, Llama), eager and compiled, with and without dropout, in FP8, and leave names, saved adapters
and PEFT's other paths as they were."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from torch import nn
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import gpucert.finetune.model.fused as fused_module
from gpucert.finetune.model.fp8 import Fp8FrozenLinear, convert_frozen_linears
from gpucert.finetune.model.fused import (
    AInGemmLoraLinear,
    FusedLoraLinear,
    FusedProjections,
    GroupSlice,
    SwiGLUInGemm,
    clear_pending,
    fuse_projections,
    refresh_adapters_in_gemm,
)
from gpucert.finetune.model.layers import decoder_layers
from gpucert.finetune.model.lora import tiny_config

VOCAB = 256
# The tiny Qwen2's shape for all three architectures; 176 intermediate (a multiple of 16) so FP8 converts the MLP.
SHAPE = {
    **{k: getattr(tiny_config(VOCAB), k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")},
    **{k: getattr(tiny_config(VOCAB), k) for k in ("num_key_value_heads", "initializer_range", "tie_word_embeddings")},
    "vocab_size": VOCAB,
    "intermediate_size": 176,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(
    arch: str = "qwen2", dropout: float = 0.0, targets: list[str] = TARGETS, seed: int = 0, **lora: Any
) -> nn.Module:
    torch.manual_seed(seed)
    if arch == "qwen2":
        base = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    elif arch == "mistral":
        base = MistralForCausalLM(MistralConfig(**SHAPE))
    else:
        base = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model = get_peft_model(
        base,
        PeftLoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM", **lora),
    )
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero: give the adapters something to add, so a wrong one shows
            nn.init.normal_(p, std=0.1)
    return model


def loss_and_grads(model: nn.Module, seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(7))
    torch.manual_seed(seed)  # the dropout masks
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


def assert_same_training(fused: nn.Module, plain: nn.Module) -> None:
    logits, grads = loss_and_grads(fused)
    ref_logits, ref_grads = loss_and_grads(plain)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 7 * 2
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch", ["qwen2", "mistral", "llama"])
def test_fused_groups_give_pefts_outputs_and_gradients(arch: str) -> None:
    plain = peft_model(arch)
    fused = copy.deepcopy(plain)
    done = fuse_projections(fused)
    assert len(done.fused) == 4 and done.shared_a == 4 and not done.left, done.summary()
    assert_same_training(fused, plain)


def test_names_parameters_and_the_saved_adapter_do_not_change(tmp_path) -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused)
    trainable = {n for n, p in plain.named_parameters() if p.requires_grad}
    assert {n for n, p in fused.named_parameters() if p.requires_grad} == trainable
    # The same number of weights, each frozen matrix once: the members' own weights are gone, not kept twice.
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())
    layer = decoder_layers(fused)[0]
    assert isinstance(layer.self_attn.qkv_proj, FusedProjections) and isinstance(
        layer.mlp.gate_up_proj, FusedProjections
    )
    assert list(layer.mlp.gate_up_proj.parameters()) == []  # gate and up keep their own frozen weights
    assert type(layer.self_attn.q_proj) is FusedLoraLinear and isinstance(layer.self_attn.q_proj.base_layer, GroupSlice)
    assert list(layer.self_attn.q_proj.base_layer.parameters()) == []
    torch.testing.assert_close(
        layer.self_attn.k_proj.base_layer.weight, decoder_layers(plain)[0].self_attn.k_proj.weight
    )
    fused.save_pretrained(str(tmp_path / "fused"))
    plain.save_pretrained(str(tmp_path / "plain"))
    from safetensors.torch import load_file

    saved, ref = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("fused", "plain"))
    assert saved.keys() == ref.keys() and all(torch.equal(saved[k], ref[k]) for k in saved)


def test_with_dropout_only_the_frozen_matrix_is_shared_and_the_masks_are_pefts() -> None:
    plain = peft_model(dropout=0.2)
    fused = copy.deepcopy(plain)
    done = fuse_projections(fused)
    # q/k/v share their stacked frozen matrix; gate/up, which would share only their A, are left.
    assert len(done.fused) == 2 and done.shared_a == 0 and len(done.left) == 2
    assert "nothing to share" in done.summary()
    plain.train()
    fused.train()
    # The same seed draws the same masks in the same order (q, k, v; gate, up), as PEFT's forward draws them.
    assert_same_training(fused, plain)


@pytest.mark.slow
def test_it_compiles_into_one_graph_per_layer_with_the_eager_results() -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused)
    for layer in decoder_layers(fused):
        # fullgraph: the hand-over of outputs between members (a module attribute) must not break the graph.
        layer.forward = torch.compile(layer.forward, backend="aot_eager", fullgraph=True)
    assert_same_training(fused, plain)
    assert all(
        layer.self_attn.qkv_proj.pending is None and layer.mlp.gate_up_proj.pending is None
        for layer in decoder_layers(fused)
    )


def test_a_member_called_out_of_order_or_on_another_input_computes_its_own_output() -> None:
    fused = peft_model()
    fuse_projections(fused)
    plain = peft_model()  # the same seed: the same weights
    attn, ref = decoder_layers(fused)[0].self_attn, decoder_layers(plain)[0].self_attn
    x, other = torch.randn(3, 64), torch.randn(3, 64)
    with torch.no_grad():
        torch.testing.assert_close(attn.k_proj(x), ref.k_proj(x))  # nothing pending: computed, not guessed
        attn.q_proj(x)  # leaves k's and v's outputs for x
        torch.testing.assert_close(attn.v_proj(other), ref.v_proj(other))  # another tensor: not x's output
        torch.testing.assert_close(attn.k_proj(x), ref.k_proj(x))
    # PEFT's own paths still work: with the adapters disabled the output is the frozen projection's alone.
    with fused.disable_adapter(), torch.no_grad():
        torch.testing.assert_close(attn.v_proj(x), ref.v_proj.base_layer(x))


def test_fp8_converts_each_groups_stacked_matrix() -> None:
    fused = peft_model()
    fused.to(torch.bfloat16)
    plain = copy.deepcopy(fused)
    fuse_projections(fused)
    done = convert_frozen_linears(fused)
    convert_frozen_linears(plain)
    names = {name.split("layers.")[1] for name in done.converted}
    assert names == {
        f"{i}.{p}"
        for i in (0, 1)
        for p in (
            "self_attn.qkv_proj.base_layer",
            "self_attn.o_proj.base_layer",
            "mlp.gate_proj.base_layer",
            "mlp.up_proj.base_layer",
            "mlp.down_proj.base_layer",
        )
    }
    stacked = decoder_layers(fused)[0].self_attn.qkv_proj.base_layer
    assert isinstance(stacked, Fp8FrozenLinear) and stacked.out_features == 64 + 2 * 32 and stacked.bias is not None
    # No bf16 copy of a converted weight is left anywhere in the layers.
    assert not [
        n for n, m in fused.named_modules() if type(m) is nn.Linear and not m.weight.requires_grad and "layers" in n
    ]
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        found, expected = fused(input_ids=ids).logits.float(), plain(input_ids=ids).logits.float()
    # The stacked matrix is quantized per output row as each member's was: the same FP8 values, bf16 rounding apart.
    assert float((found - expected).norm() / expected.norm()) < 0.02


def test_groups_that_cannot_fuse_are_left_with_the_reason() -> None:
    model = peft_model(targets=["q_proj", "v_proj", "gate_proj", "up_proj"])  # k_proj has no adapter
    done = fuse_projections(model)
    assert len(done.fused) == 2 and len(done.left) == 2  # gate/up of both layers; q/k/v of neither
    assert "k_proj: Linear, not a PEFT LoRA Linear" in done.summary()
    assert all("self_attn" in where for where in done.left)


def test_outputs_left_by_a_failed_forward_can_be_dropped_and_merging_is_refused() -> None:
    fused = peft_model()
    fuse_projections(fused)
    attn = decoder_layers(fused)[0].self_attn
    with torch.no_grad():
        attn.q_proj(torch.randn(3, 64))  # as if the forward had failed before k and v
    assert attn.qkv_proj.pending is not None
    clear_pending(fused)
    assert attn.qkv_proj.pending is None
    with pytest.raises(ValueError, match=r"model\.fuse_projections=false"):
        attn.q_proj.merge()


def test_an_architecture_not_known_to_call_its_projections_in_order_is_left() -> None:
    model = peft_model()
    for layer in decoder_layers(model):
        layer.self_attn.__class__ = type("OtherAttention", (type(layer.self_attn),), {})
    done = fuse_projections(model)
    assert len(done.fused) == 2 and "OtherAttention, not one of" in done.summary()


# --- Adapters inside the frozen GEMM (model.adapters_in_gemm) ----------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "mistral", "llama"])
def test_adapters_in_the_frozen_gemm_give_pefts_outputs_and_gradients(arch: str) -> None:
    plain = peft_model(arch)
    fused = copy.deepcopy(plain)
    done = fuse_projections(fused, adapters_in_gemm=True)
    assert done.in_gemm == 4 and "4 with the adapters in the frozen GEMM" in done.summary()
    assert done.a_in_gemm == 4 and "4 single projections with their A in the frozen GEMM" in done.summary()
    assert type(decoder_layers(fused)[1].mlp.down_proj) is AInGemmLoraLinear
    assert_same_training(fused, plain)


def test_the_extended_matrices_hold_the_frozen_weights_once_and_follow_b_after_a_step() -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused, adapters_in_gemm=True)
    attn, mlp = decoder_layers(fused)[0].self_attn, decoder_layers(fused)[0].mlp
    # q/k/v: one matrix [64 + 32 + 32, 64 + 3 x 8]; gate and up: one each [176, 64 + 2 x 8]. The frozen weights are
    # views of them, so nothing is kept twice and the parameter count is unchanged.
    assert [tuple(e.shape) for e in attn.qkv_proj.extended] == [(128, 88)]
    assert [tuple(e.shape) for e in mlp.gate_up_proj.extended] == [(176, 80), (176, 80)]
    assert attn.qkv_proj.base_layer.weight.data_ptr() == attn.qkv_proj.extended[0].data_ptr()
    assert mlp.up_proj.base_layer.weight.data_ptr() == mlp.gate_up_proj.extended[1].data_ptr()
    # down_proj and o_proj: [W; A], W's rows then A's 8 (unscaled: A's product is the GEMM's extra output).
    assert tuple(mlp.down_proj.gpucert_extended.shape) == (64 + 8, 176)
    assert mlp.down_proj.base_layer.weight.data_ptr() == mlp.down_proj.gpucert_extended.data_ptr()
    torch.testing.assert_close(mlp.down_proj.gpucert_extended[64:], mlp.down_proj.lora_A["default"].weight)
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())
    # An optimizer step changes A and B; the next forward must see them (the pre-hook refreshes the columns).
    for model in (fused, plain):
        loss_and_grads(model)
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    assert_same_training(fused, plain)
    torch.testing.assert_close(mlp.down_proj.gpucert_extended[64:], mlp.down_proj.lora_A["default"].weight)
    # The up projection's block of gate's matrix stays zero: gate never adds up's adapter.
    assert not bool(mlp.gate_up_proj.extended[0][:, 64 + 8 :].any())
    with fused.disable_adapter(), torch.no_grad():
        x = torch.randn(3, 64)
        torch.testing.assert_close(attn.k_proj(x), decoder_layers(plain)[0].self_attn.k_proj.base_layer(x))


@pytest.mark.slow
def test_a_settled_refresh_leaves_the_forwards_nothing_to_copy_until_an_adapter_changes(monkeypatch) -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused, adapters_in_gemm=True)
    copies = []
    copy_scaled = fused_module._copy_scaled
    monkeypatch.setattr(fused_module, "_copy_scaled", lambda items: (copies.append(len(items)), copy_scaled(items)))

    def assert_same_outputs() -> None:
        # AdamW's first steps are near lr x sign(grad): rounding apart, not as close as assert_same_training's.
        torch.testing.assert_close(loss_and_grads(fused)[0], loss_and_grads(plain)[0], rtol=1e-3, atol=1e-4)

    def adamw_step(model: nn.Module) -> None:
        loss_and_grads(model)
        # The fused AdamW updates the adapters without bumping their version counters.
        torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, fused=True).step()

    # Never settled (a loop of one's own): every forward copies, so a fused AdamW step is seen.
    for model in (fused, plain):
        adamw_step(model)
    assert_same_outputs()
    assert copies == [14, 14]  # 7 adapters a layer: q, k, v and gate, up B; o and down A
    # The trainer settles right after each optimizer step; the forwards after it copy nothing.
    for model in (fused, plain):
        adamw_step(model)
    copies.clear()
    refresh_adapters_in_gemm(fused, settled=True)
    assert_same_outputs()
    loss_and_grads(fused)
    assert copies == [14]
    # A checkpoint's load bumps the versions: the next forward copies again.
    state = {k: v + 0.1 for k, v in plain.state_dict().items() if "lora_" in k}
    for model in (fused, plain):
        model.load_state_dict(state, strict=False)
    copies.clear()
    assert_same_outputs()
    assert copies == [14]

    # New storage through `.data`, another Parameter or module in an adapter's place bump no version: each is seen.
    def new_storage(model: nn.Module) -> None:
        a = decoder_layers(model)[0].mlp.down_proj.lora_A["default"].weight
        a.data = torch.randn_like(a)

    def new_parameter(model: nn.Module) -> None:
        b = decoder_layers(model)[1].self_attn.k_proj.lora_B["default"]
        b.weight = nn.Parameter(torch.randn_like(b.weight))

    def new_module(model: nn.Module) -> None:
        # As PEFT's update_layer builds them: a new Linear in the adapter's ModuleDict.
        gate = decoder_layers(model)[0].mlp.gate_proj
        old = gate.lora_B["default"]
        gate.lora_B["default"] = nn.Linear(old.in_features, old.out_features, bias=False)
        nn.init.normal_(gate.lora_B["default"].weight, std=0.1)

    for change in (new_storage, new_parameter, new_module):
        torch.manual_seed(1)
        change(plain)
        torch.manual_seed(1)
        change(fused)
        refresh_adapters_in_gemm(fused, settled=True)
        copies.clear()
        loss_and_grads(fused)
        assert copies == []
        torch.manual_seed(2)
        change(plain)
        torch.manual_seed(2)
        change(fused)
        copies.clear()
        assert_same_outputs()
        assert copies == [14]


@pytest.mark.slow
def test_adapters_in_the_gemm_compile_into_one_graph_per_layer() -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused, adapters_in_gemm=True)
    for layer in decoder_layers(fused):
        layer.forward = torch.compile(layer.forward, backend="aot_eager", fullgraph=True)
    assert_same_training(fused, plain)


def test_with_dropout_no_adapter_goes_into_the_gemm() -> None:
    fused = peft_model(dropout=0.2)
    done = fuse_projections(fused, adapters_in_gemm=True)
    assert done.in_gemm == 0 and done.a_in_gemm == 0 and "in the frozen GEMM" not in done.summary()


def test_a_projection_with_its_a_in_the_gemm_refuses_to_merge_and_keeps_pefts_other_paths() -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused, adapters_in_gemm=True)
    down = decoder_layers(fused)[0].mlp.down_proj
    with pytest.raises(ValueError, match=r"model\.adapters_in_gemm=false"):
        down.merge()
    x = torch.randn(3, 176)
    with fused.disable_adapter(), torch.no_grad():
        torch.testing.assert_close(down(x), decoder_layers(plain)[0].mlp.down_proj.base_layer(x))
    # Only the adapter's own parameters get gradients; W, a view of the extended matrix, stays frozen.
    down(x.requires_grad_()).sum().backward()
    assert down.base_layer.weight.grad is None and down.lora_A["default"].weight.grad is not None


def test_load_model_puts_adapters_in_the_gemm_only_where_they_compute_in_its_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bf16 weights with adapters under autocast: yes. fp32 (no autocast), FP8 frozen weights, weights FSDP2 will
    shard, LoRA dropout, or the switch off: no."""
    import gpucert.finetune.model.lora as model_module
    from gpucert.finetune.config import DataConfig, LoraConfig, ModelConfig
    from gpucert.finetune.data.tokenizer import load_tokenizer
    from gpucert.finetune.model.lora import load_model

    monkeypatch.setattr(model_module, "check_fp8_device", lambda device: None)
    tokenizer = load_tokenizer(ModelConfig(name="tiny"), DataConfig())
    lora = LoraConfig(r=8, alpha=16, dropout=0.0)
    bf16 = ModelConfig(name="tiny", dtype="bf16")
    cases = [
        (bf16, lora, False, "4 with the adapters in the frozen GEMM"),
        (ModelConfig(name="tiny", dtype="fp32"), lora, False, None),
        (ModelConfig(name="tiny", dtype="bf16", precision="fp8"), lora, False, None),
        (bf16, lora, True, None),
        (bf16, LoraConfig(r=8, alpha=16, dropout=0.1), False, None),
        (ModelConfig(name="tiny", dtype="bf16", adapters_in_gemm=False), lora, False, None),
    ]
    # The fused MLP comes with the adapters in the GEMMs, unless switched off or down_proj has no adapter.
    for model_cfg, lora_cfg, fused_mlp in [
        (bf16, lora, True),
        (ModelConfig(name="tiny", dtype="bf16", fuse_mlp=False), lora, False),
        (bf16, LoraConfig(r=8, alpha=16, dropout=0.0, target_modules=TARGETS[:-1]), False),
    ]:
        _, info = load_model(model_cfg, lora_cfg, tokenizer, torch.device("cpu"))
        assert ("2 MLPs as one function" in info.fused_projections) is fused_mlp, info.fused_projections
        assert "4 with the adapters in the frozen GEMM" in info.fused_projections
    for model_cfg, lora_cfg, sharded, expected in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FP8 names the tiny MLP's 172 features it leaves in bf16
            _, info = load_model(model_cfg, lora_cfg, tokenizer, torch.device("cpu"), sharded=sharded)
        if expected:
            assert expected in info.fused_projections, info.fused_projections
        else:
            assert "in the frozen GEMM" not in info.fused_projections, (model_cfg, lora_cfg, sharded)


# --- Each MLP one function, its backward one kernel (model.fuse_mlp) ---------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "mistral", "llama"])
def test_the_fused_mlp_gives_pefts_outputs_and_gradients(arch: str) -> None:
    plain = peft_model(arch)
    fused = copy.deepcopy(plain)
    done = fuse_projections(fused, adapters_in_gemm=True, mlp=True)
    assert done.mlp == 2 and "2 MLPs as one function" in done.summary() and not done.left
    mlp = decoder_layers(fused)[0].mlp
    assert (
        isinstance(mlp, SwiGLUInGemm) and type(mlp).__name__ == f"{type(decoder_layers(plain)[0].mlp).__name__}InGemm"
    )
    assert_same_training(fused, plain)


def test_the_fused_mlp_compiles_into_one_graph_per_layer() -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused, adapters_in_gemm=True, mlp=True)
    for layer in decoder_layers(fused):
        layer.forward = torch.compile(layer.forward, backend="aot_eager", fullgraph=True)
    assert_same_training(fused, plain)


def test_a_fused_mlp_with_its_adapters_disabled_runs_pefts_path() -> None:
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused, adapters_in_gemm=True, mlp=True)
    x = torch.randn(2, 5, SHAPE["hidden_size"])
    with fused.disable_adapter(), plain.disable_adapter(), torch.no_grad():
        torch.testing.assert_close(decoder_layers(fused)[0].mlp(x), decoder_layers(plain)[0].mlp(x))
    # And with them back on, the fused function again, with PEFT's result.
    with torch.no_grad():
        torch.testing.assert_close(
            decoder_layers(fused)[0].mlp(x), decoder_layers(plain)[0].mlp(x), rtol=1e-5, atol=1e-5
        )


def test_mlps_that_cannot_fuse_are_left_with_the_reason() -> None:
    no_down = peft_model(targets=TARGETS[:-1])
    done = fuse_projections(no_down, adapters_in_gemm=True, mlp=True)
    assert done.mlp == 0 and set(done.left.values()) == {"MLP: down_proj without its A in its frozen GEMM"}
    # Without the adapters in the GEMMs (here: dropout) there is nothing to fuse, and nothing is named.
    dropout = peft_model(dropout=0.2)
    done = fuse_projections(dropout, adapters_in_gemm=False, mlp=True)
    assert done.mlp == 0 and not any(v.startswith("MLP") for v in done.left.values())
    gelu = peft_model()
    for layer in decoder_layers(gelu):
        layer.mlp.config.hidden_act = "gelu"  # the config is shared: HF's act_fn was built from it as silu
    done = fuse_projections(gelu, adapters_in_gemm=True, mlp=True)
    assert done.mlp == 0 and set(done.left.values()) == {"MLP: activation 'gelu' (SiLUActivation), not silu"}


def test_the_fused_mlp_keeps_each_projections_own_rank_and_scale() -> None:
    # gate, up and down_proj each their own alpha, down_proj its own rank: a swapped scale or rank shows.
    plain = peft_model(rank_pattern={"down_proj": 4}, alpha_pattern={"gate_proj": 4, "up_proj": 24, "down_proj": 12})
    fused = copy.deepcopy(plain)
    assert fuse_projections(fused, adapters_in_gemm=True, mlp=True).mlp == 2
    assert_same_training(fused, plain)


def test_a_fused_mlp_in_a_mixed_batch_runs_pefts_path() -> None:
    """PEFT's adapter_names (one adapter a row, "__base__" for none) reaches each projection by a forward
    pre-hook, which runs only if the projection is called: the fused MLP then runs the MLP's own forward."""
    plain = peft_model()
    fused = copy.deepcopy(plain)
    fuse_projections(fused, adapters_in_gemm=True, mlp=True)
    plain.eval(), fused.eval()  # PEFT takes adapter_names in eval mode only
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    names = ["__base__", "default"]
    with torch.no_grad():
        found = fused(input_ids=ids, adapter_names=names).logits
        want = plain(input_ids=ids, adapter_names=names).logits
        adapted = plain(input_ids=ids).logits
    assert (want[0] - adapted[0]).abs().max() > 1e-2  # the first row really runs without its adapter
    torch.testing.assert_close(found, want, rtol=1e-5, atol=1e-5)


def test_an_mlp_of_a_rank_over_the_kernels_is_left() -> None:
    model = peft_model(rank_pattern={"down_proj": 32})
    done = fuse_projections(model, adapters_in_gemm=True, mlp=True)
    assert done.mlp == 0 and set(done.left.values()) == {"MLP: LoRA rank 32, over the 16 the kernel is measured at"}
