"""Projections that share an input run as one (`model.fuse_projections`): q/k/v, and the MLP's gate/up.

A decoder layer feeds one tensor to q_proj, k_proj and v_proj, and another to gate_proj and up_proj. PEFT runs
each of them on its own: a frozen GEMM and an adapter down-projection x @ A^T per projection, each reading x
again, and in the backward one input-gradient GEMM per frozen weight and per adapter, every result a full-size
tensor that is then summed. Here q/k/v's frozen weights are one matrix (rows stacked once, at load) and, without
LoRA dropout, each group's A matrices one (stacked at every call: r x in, tiny): for q/k/v the forward reads x
twice instead of six times and the backward writes two input-gradient tensors instead of six. gate/up share
only their A (see GROUPS). With dropout each adapter keeps its own A and its own mask, as PEFT draws them, and
only q/k/v's frozen matrix is shared. The adapters' up-projections B stay one per projection. Every output is
PEFT's formula, not bit for bit (the stacked GEMMs sum in another order: about 5e-6 of a gradient's largest
element in fp32); what it saves is memory traffic and kernel launches (docs/OPTIMIZATION.md).

How it plugs in, so that HF's attention and MLP code stays as it is (generation with a KV cache included):
each member keeps its place and its parameter names (checkpoints and saved adapters do not change), its class
becomes a subclass of PEFT's `Linear` whose forward asks the group. The first member called computes every
member's output and leaves the others' for them; a later member takes its output only if it is called with
the very same input tensor, else it computes the group again (always right, only slower, for a model that calls
its projections in another order). Outputs left by a forward that failed half-way are replaced at the next
forward, or dropped by `clear_pending` (the trainer calls it when a step runs out of memory). Where the frozen
weights are stacked, the
members' own are dropped: each `base_layer` becomes a `GroupSlice`, its rows of the group's matrix, so PEFT's
own forward (disabled adapters, mixed batches) still works; merging an adapter into a fused layer is refused
(gpucert merges into a freshly loaded base). FP8 (`model.precision: fp8`) converts the stacked matrix like any
other frozen linear.

Adapters inside the frozen GEMM (`model.adapters_in_gemm`, bf16 with one A per group, not FSDP2): each frozen matrix
W of a group is kept as [W | s B] with the group's r_total extra columns (each member's scaled B in its own block,
zeros elsewhere), and the GEMM takes [x | x A^T]: one GEMM gives base + adapter, so no adapter output (8,192 x
18,944 for gate and up) is written and read back, and its input-gradient GEMM gives dx and d(xA) at once; only dB =
s dy^T (xA) reads dy again (`_AdapterInGemm`, in_gemm.py). The extra columns are refreshed from B, scaled and cast
to bf16, before every forward of the model (a forward pre-hook, outside the compiled layers), so a step's forward
and backward see the B the optimizer left; the trainer refreshes right after its optimizer step instead, and the
pre-hook then has nothing to copy (`refresh_adapters_in_gemm`). The projections outside the groups (o_proj,
down_proj: `SINGLES`) carry their A the other way, as extra rows: x @ [W; A]^T gives the base output and xA at once,
and the backward's [dy | d(xA)] @ [W; A] gives dx with the adapter's share (`_AInGemm`). Measured on the lent H100
(docs/OPTIMIZATION.md).

The fused MLP (`model.fuse_mlp`, with the adapters in the frozen GEMMs): where gate/up are such a group and
down_proj carries its A, the MLP's class becomes a subclass of its own and `SwiGLUInGemm`, whose forward is one
autograd function (`_SwiGLUInGemm`, in_gemm.py) over the three. Its backward runs kernels/swiglu.py's Triton kernel:
the SwiGLU backward and the three rank-r weight gradients that read an intermediate-sized tensor, from one pass,
with silu(gate) * up recomputed rather than kept (11.8 GiB less at Qwen2-7B's micro-batch 3). While any of the three
projections has its adapter disabled or merged, or a hook (PEFT's mixed batches), the MLP's own forward runs instead
(PEFT's paths). Up to LoRA rank 16 (config.FUSED_MLP_MAX_RANK).

Fused only in the architectures whose attention and MLP code is known to call every member, in order, on one tensor
(Qwen2, Mistral, Llama: `ARCHITECTURES`), and where every member is a plain LoRA layer with one adapter, no DoRA or
other variant, not merged, over an nn.Linear; other groups are left as they are and named, with the reason, in
`fuse_projections`'s result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn

from gpucert.finetune.config import FUSED_MLP_MAX_RANK
from gpucert.finetune.model.in_gemm import _AdapterInGemm, _AInGemm, _SwiGLUInGemm
from gpucert.finetune.model.layers import decoder_layers

ADAPTER = "default"
# (child of a decoder layer, its projections that take the same input in the order HF's code calls them, the
# group's name: the one HF gives such stacked projections in models built with them, e.g. Phi-3, and whether the
# frozen weights are stacked too). gate/up keep their own frozen GEMMs: stacked, the FP8 step's input gradient
# of the pair is quantized over one 37,888-wide row, which took inductor an extra pass over it (17 ms a step,
# 2 % slower, lent H100, docs/OPTIMIZATION.md); their A matrices are still one.
GROUPS = (
    ("self_attn", ("q_proj", "k_proj", "v_proj"), "qkv_proj", True),
    ("mlp", ("gate_proj", "up_proj"), "gate_up_proj", False),
)
# HF classes (the architecture's name + Attention / MLP) whose forward calls q, k, v (gate, up) in that order on
# one tensor, every layer: what the hand-over assumes to be fast, and the tests check for each.
ARCHITECTURES = ("Qwen2", "Mistral", "Llama")
# The projections outside the groups, each with its A in its own frozen GEMM (`_AInGemm`) when the groups carry
# their adapters in theirs: down_proj's input is 18,944 wide on Qwen2-7B, so x A^T's read of it and d(xA) A's
# write of a gradient that size are what this saves.
SINGLES = (("self_attn", "o_proj"), ("mlp", "down_proj"))


class GroupSlice(nn.Module):
    """A fused member's `base_layer`: its rows of the group's frozen projection, no parameters of its own."""

    group: FusedProjections

    def __init__(self, group: FusedProjections, start: int, stop: int) -> None:
        super().__init__()
        object.__setattr__(self, "group", group)  # not a submodule: the group has one owner, its layer's child
        self.start, self.stop = start, stop
        self.in_features, self.out_features = group.in_features, stop - start

    @property
    def weight(self) -> torch.Tensor:
        weight = self.group.base_layer.weight
        assert isinstance(weight, torch.Tensor)
        return weight[self.start : self.stop]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.base_layer(x)[..., self.start : self.stop]


class FusedProjections(nn.Module):
    """One group (module docstring): the stacked frozen projection `base_layer` and the members it serves."""

    base_layer: nn.Module  # the stacked frozen projection: nn.Linear, or fp8.Fp8FrozenLinear once converted
    members: tuple[Any, ...]  # PEFT LoRA Linear layers (FusedLoraLinear once fused)

    def __init__(self, members: list[Any], stack: bool = True) -> None:
        super().__init__()
        bases: list[nn.Linear] = [m.base_layer for m in members]
        object.__setattr__(self, "members", tuple(members))  # they stay where they are (their names unchanged)
        # One A for the group only without dropout: PEFT draws an independent mask per projection.
        self.shared_a = not any(has_dropout(m) for m in members)
        self.ranks = [m.r[ADAPTER] for m in members]
        self.stacked = stack
        # (input, outputs) of the last computation, until its last member has taken its output.
        self.pending: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        # With adapters in the GEMM: each frozen matrix extended by the group's adapter columns (plain tensors,
        # not parameters: the frozen weight is a view of them), and where each member's B sits in them.
        self.extended: list[torch.Tensor] = []
        self.blocks: list[tuple[tuple[int, int, int, int, float], ...]] = []  # (rows of y, columns of xa, s)
        self.block_members: list[list[int]] = []  # the member whose B fills each block
        if not stack:
            return  # each member keeps its own base_layer
        weight = torch.cat([b.weight.detach() for b in bases])
        self.in_features = bases[0].in_features
        self.sizes = [b.out_features for b in bases]
        stacked = nn.Linear(
            self.in_features, weight.shape[0], bias=any(b.bias is not None for b in bases), device="meta"
        )
        stacked.weight = nn.Parameter(weight, requires_grad=False)
        if stacked.bias is not None:
            zeros = [torch.zeros(b.out_features, dtype=weight.dtype, device=weight.device) for b in bases]
            bias = torch.cat([b.bias.detach() if b.bias is not None else z for b, z in zip(bases, zeros, strict=True)])
            stacked.bias = nn.Parameter(bias, requires_grad=False)
        self.base_layer = stacked

    def frozen_layers(self) -> list[Any]:
        """The group's frozen projections: its stacked one, or each member's own."""
        return [self.base_layer] if self.stacked else [m.base_layer for m in self.members]

    def extend(self) -> None:
        """Keep every frozen matrix of the group with the adapters' columns (module docstring), in place: the
        frozen weights become views of the extended matrices, so memory grows by r_total columns only."""
        offsets = [sum(self.ranks[:i]) for i in range(len(self.ranks))]
        rows = [sum(self.sizes[:i]) for i in range(len(self.sizes))] if self.stacked else []
        for j, base in enumerate(self.frozen_layers()):
            weight = base.weight.detach()
            out_features, width = weight.shape
            extended = torch.zeros(out_features, width + sum(self.ranks), dtype=weight.dtype, device=weight.device)
            extended[:, :width] = weight
            base.weight = nn.Parameter(extended[:, :width], requires_grad=False)
            self.extended.append(extended)
            members = list(range(len(self.members))) if self.stacked else [j]
            self.block_members.append(members)
            self.blocks.append(
                tuple(
                    (
                        rows[i] if self.stacked else 0,
                        (rows[i] + self.sizes[i]) if self.stacked else out_features,
                        offsets[i],
                        offsets[i] + self.ranks[i],
                        float(self.members[i].scaling[ADAPTER]),
                    )
                    for i in members
                )
            )
        _copy_scaled(self.refresh_items())

    def refresh_items(self) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        """(block of an extended matrix, the member's B, its scale) for each member's B, copied in by
        `refresh_adapters_in_gemm` before every forward."""
        items = []
        for j, extended in enumerate(self.extended):
            width = extended.shape[1] - sum(self.ranks)
            for i, (row0, row1, col0, col1, scale) in zip(self.block_members[j], self.blocks[j], strict=True):
                b = self.members[i].lora_B[ADAPTER].weight
                items.append((extended[row0:row1, width + col0 : width + col1], b, scale))
        return items

    def adapter_weights(self) -> list[torch.Tensor]:
        """The Bs refresh_items copies, looked up as it looks them up, without slicing the extended matrices."""
        return [self.members[i].lora_B[ADAPTER].weight for members in self.block_members for i in members]

    def shared_a_weight(self) -> torch.Tensor:
        """The group's one A: the members' A matrices stacked, in the members' order (r_total x in)."""
        return torch.cat([m.lora_A[ADAPTER].weight for m in self.members])

    def outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every member's output for input x, as PEFT's forward computes each (base + B(A(x)) * scaling)."""
        if self.extended:
            return self._outputs_in_gemm(x)
        ys = self.base_layer(x).split(self.sizes, -1) if self.stacked else tuple(m.base_layer(x) for m in self.members)
        xa = self.members[0]._cast_input_dtype(x, self.members[0].lora_A[ADAPTER].weight.dtype)
        if self.shared_a:
            hs = F.linear(xa, self.shared_a_weight()).split(self.ranks, -1)
        else:
            hs = tuple(m.lora_A[ADAPTER](m.lora_dropout[ADAPTER](xa)) for m in self.members)
        out = []
        for i, m in enumerate(self.members):  # indexed, not zip(strict=...): this runs under torch.compile
            out.append((ys[i] + m.lora_B[ADAPTER](hs[i]) * m.scaling[ADAPTER]).to(ys[i].dtype))
        return out

    def _outputs_in_gemm(self, x: torch.Tensor) -> list[torch.Tensor]:
        # Under autocast: bf16, as the adapters' products are in the plain path.
        xa = F.linear(x, self.shared_a_weight())
        outs: list[torch.Tensor] = []
        for j, base in enumerate(self.frozen_layers()):
            bs = [self.members[i].lora_B[ADAPTER].weight for i in self.block_members[j]]
            y = _AdapterInGemm.apply(x, xa, self.extended[j], base.bias, self.blocks[j], *bs)
            # Each member's output its own tensor, as the plain path's adds make them: a view would keep the whole
            # stacked output alive for as long as any member's is kept (attention keeps v: 75 MB for 8 a layer).
            outs.extend([part.contiguous() for part in y.split(self.sizes, -1)] if self.stacked else [y])
        return outs

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        pending = self.pending
        if index > 0 and pending is not None and pending[0] is x:
            if index == len(self.members) - 1:
                self.pending = None
            return pending[1][index]
        outs = self.outputs(x)
        self.pending = (x, outs) if index == 0 else None
        return outs[index]


class FusedLoraLinear(LoraLinear):
    """PEFT's LoRA Linear whose forward is served by its group (instances are PEFT layers re-classed in place)."""

    gpucert_group: FusedProjections
    gpucert_index: int

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs or self.disable_adapters or self.merged:
            return super().forward(x, *args, **kwargs)  # PEFT's path; base_layer (a GroupSlice) still computes
        return self.gpucert_group.output(self.gpucert_index, x)

    def merge(self, *args: Any, **kwargs: Any) -> None:
        # A GroupSlice's weight is a view computed on each access (FP8: quantized): PEFT's merge would be lost.
        raise ValueError(
            "a fused projection cannot merge its adapter in place: load the model with model.fuse_projections=false "
            "to merge, or merge the saved adapter into a freshly loaded base (gpucert finetune does)"
        )


class AInGemmLoraLinear(LoraLinear):
    """PEFT's LoRA Linear (re-classed in place) whose A rides in its frozen GEMM (`_AInGemm`): its base layer's
    weight is the first rows of `gpucert_extended`, [W; A], whose last r rows are refreshed from A, cast to the
    frozen dtype, before every forward of the model."""

    gpucert_extended: torch.Tensor

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs or self.disable_adapters or self.merged:
            return super().forward(x, *args, **kwargs)  # PEFT's path: base_layer's weight is W itself
        a, b = _adapter_weight(self, "lora_A"), _adapter_weight(self, "lora_B")
        return _AInGemm.apply(x, self.gpucert_extended, self.base_layer.bias, a, b, float(self.scaling[ADAPTER]))

    def refresh_items(self) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        a = _adapter_weight(self, "lora_A")
        return [(self.gpucert_extended[-a.shape[0] :], a, 1.0)]

    def adapter_weights(self) -> list[torch.Tensor]:
        return [_adapter_weight(self, "lora_A")]

    def merge(self, *args: Any, **kwargs: Any) -> None:
        # PEFT's merge may give the base layer a new weight tensor; the extended matrix would then be stale.
        raise ValueError(
            "a projection with its adapter in the frozen GEMM cannot merge in place: load the model with "
            "model.adapters_in_gemm=false to merge, or merge the saved adapter into a freshly loaded base "
            "(gpucert finetune does)"
        )


class SwiGLUInGemm(nn.Module):
    """Mixed into an MLP's class in place (`fuse_mlp`): its forward runs `_SwiGLUInGemm` over the fused gate/up
    group and down_proj, or the class's own forward (PEFT's paths) while any of the three has its adapter
    disabled or merged, or a hook. The class is made at run time, so a fused model cannot be pickled whole
    (torch.save(model)); its adapters save as PEFT's, as gpucert saves them."""

    gate_proj: Any
    up_proj: Any
    down_proj: Any

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = self.gate_proj, self.up_proj, self.down_proj
        if needs_pefts_path(gate, up, down):
            return super().forward(x)
        group = gate.gpucert_group
        # gate's and up's scales as their extended columns hold them (the group's blocks), as _AdapterInGemm's dB.
        (gate_block,), (up_block,) = group.blocks
        scales = (gate_block[4], up_block[4], float(down.scaling[ADAPTER]))
        bs = (_adapter_weight(gate, "lora_B"), _adapter_weight(up, "lora_B"))
        down_a, down_b = _adapter_weight(down, "lora_A"), _adapter_weight(down, "lora_B")
        w_gate, w_up = group.extended
        a = group.shared_a_weight()
        return _SwiGLUInGemm.apply(x, a, w_gate, w_up, down.gpucert_extended, scales, *bs, down_a, down_b)


def needs_pefts_path(*projections: Any) -> bool:
    """Whether a fused MLP must run its class's own forward (PEFT's paths): a projection with its adapter disabled
    or merged, or with a hook (PEFT's mixed batches pass adapter_names through a pre-hook), which runs only if
    the projections themselves are called."""
    return any(m.disable_adapters or m.merged or m._forward_pre_hooks or m._forward_hooks for m in projections)


def activation_problem(mlp: nn.Module) -> str | None:
    """Why an MLP's activation is not the SiLU the fused MLPs compute, or None: its config's and its module's."""
    act, act_fn = getattr(getattr(mlp, "config", None), "hidden_act", None), type(getattr(mlp, "act_fn", None)).__name__
    if act != "silu" or act_fn not in ("SiLU", "SiLUActivation"):
        return f"activation {act!r} ({act_fn}), not silu"
    return None


# (an MLP class, the mixin) -> the class made of the two, made once.
_MLP_CLASSES: dict[tuple[type, type], type] = {}


def reclass_mlp(mlp: nn.Module, mixin: type, suffix: str) -> None:
    """Re-class `mlp` in place as a subclass of `mixin` and its own class (named with `suffix`): fuse_mlp's and
    fp8_mlp.fuse_fp8_mlp's. The class is made at run time, so such a model cannot be pickled whole."""
    cls = type(mlp)
    if (cls, mixin) not in _MLP_CLASSES:
        _MLP_CLASSES[cls, mixin] = type(f"{cls.__name__}{suffix}", (mixin, cls), {})
    mlp.__class__ = _MLP_CLASSES[cls, mixin]


def mlp_problem(mlp: nn.Module) -> str | None:
    """Why an MLP cannot run as `SwiGLUInGemm`, or None: its gate/up must be one fused group with the adapters in
    the frozen GEMMs and equal ranks, its down_proj must carry its A in its frozen GEMM, no biases, SiLU."""
    gate: Any = getattr(mlp, "gate_proj", None)
    up: Any = getattr(mlp, "up_proj", None)
    down: Any = getattr(mlp, "down_proj", None)
    group = getattr(gate, "gpucert_group", None)
    if not isinstance(group, FusedProjections) or not group.extended or group.stacked:
        return "gate/up not one group with its adapters in the frozen GEMMs"
    ranks = set(group.ranks)
    if getattr(up, "gpucert_group", None) is not group or len(ranks) != 1:
        return "gate/up of different groups or ranks"
    if not isinstance(down, AInGemmLoraLinear):
        return "down_proj without its A in its frozen GEMM"
    rank = max(*ranks, down.r[ADAPTER])
    if rank > FUSED_MLP_MAX_RANK:
        return f"LoRA rank {rank}, over the {FUSED_MLP_MAX_RANK} the kernel is measured at"
    if any(getattr(m, "base_layer", None) is None or m.base_layer.bias is not None for m in (gate, up, down)):
        return "a projection with a bias"
    return activation_problem(mlp)


def fuse_mlp(mlp: nn.Module) -> None:
    """Re-class `mlp` in place as a subclass of its own class and SwiGLUInGemm (checked by mlp_problem first)."""
    reclass_mlp(mlp, SwiGLUInGemm, "InGemm")


def _adapter_weight(module: nn.Module, name: str) -> torch.Tensor:
    weight = getattr(module, name)[ADAPTER].weight
    assert isinstance(weight, torch.Tensor)
    return weight


def put_a_in_gemm(module: Any) -> None:
    """Re-class one plain LoRA projection (no dropout) as an AInGemmLoraLinear: its frozen weight becomes a view
    of [W; A], so memory grows by A's r rows only."""
    base = module.base_layer
    weight = base.weight.detach()
    a = _adapter_weight(module, "lora_A")
    extended = torch.empty(weight.shape[0] + a.shape[0], weight.shape[1], dtype=weight.dtype, device=weight.device)
    extended[: weight.shape[0]] = weight
    base.weight = nn.Parameter(extended[: weight.shape[0]], requires_grad=False)
    module.__class__ = AInGemmLoraLinear
    object.__setattr__(module, "gpucert_extended", extended)  # a plain tensor, not a buffer: W is the parameter
    _copy_scaled(module.refresh_items())


def has_dropout(module: nn.Module) -> bool:
    dropouts = getattr(module, "lora_dropout", None)
    if not isinstance(dropouts, nn.ModuleDict) or ADAPTER not in dropouts:
        return False
    return not isinstance(dropouts[ADAPTER], nn.Identity)


def fusable_problem(module: nn.Module, base: type = nn.Linear) -> str | None:
    """Why a projection cannot join a group, or None. `base`: the frozen layer's class (fp8_mlp.py asks with
    Fp8FrozenLinear, after conversion)."""
    if type(module) is not LoraLinear:
        return f"{type(module).__name__}, not a PEFT LoRA Linear"
    if list(module.lora_A) != [ADAPTER] or list(module.active_adapters) != [ADAPTER]:
        return f"adapters {list(module.lora_A)}, expected one named {ADAPTER!r}"
    if getattr(module, "lora_variant", {}) or module.use_dora.get(ADAPTER, False):
        return "a LoRA variant (DoRA)"
    if module.merged or module.disable_adapters:
        return "merged or disabled"
    if module.fan_in_fan_out or getattr(module, "lora_bias", {}).get(ADAPTER, False):
        return "fan_in_fan_out or lora_bias"
    if type(module.base_layer) is not base:
        return f"base layer {type(module.base_layer).__name__}, not {base.__name__}"
    return None


@dataclass
class Fusion:
    """What fuse_projections did: the groups fused (qualified names) and why each other one was not."""

    fused: list[str] = field(default_factory=list)
    shared_a: int = 0
    in_gemm: int = 0
    a_in_gemm: int = 0  # single projections (o_proj, down_proj) with their A in the frozen GEMM
    mlp: int = 0  # MLPs run as SwiGLUInGemm (fuse_mlp)
    left: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: how many groups, with one A or not, and the reasons of those left (each reason once)."""
        text = f"{len(self.fused)} groups fused ({self.shared_a} with one A matrix"
        text += f", {self.in_gemm} with the adapters in the frozen GEMM)" if self.in_gemm else ")"
        if self.a_in_gemm:
            text += f", {self.a_in_gemm} single projections with their A in the frozen GEMM"
        if self.mlp:
            text += (
                f", {self.mlp} MLPs as one function (the SwiGLU with the adapters' rank-r products; the plan's "
                "fused MLP line says by which kernels: Triton on a GPU, their torch reference without CUDA)"
            )
        reasons = sorted(set(self.left.values()))
        if reasons:
            text += f"; {len(self.left)} left as they are: " + " | ".join(reasons)
        return text


def fuse_projections(model: nn.Module, adapters_in_gemm: bool = False, mlp: bool = False) -> Fusion:
    """Fuse the q/k/v and gate/up groups of every decoder layer of `model` (after PEFT wrapped it, before FP8
    conversion and compiling), in place. `adapters_in_gemm`: groups with one A also carry their adapters in the
    frozen GEMM (module docstring; only for bf16/fp16 frozen weights whose adapters compute under autocast, and
    not under FSDP2, which would shard the frozen views: the caller decides), refreshed by a forward pre-hook on
    `model`. `mlp` (with `adapters_in_gemm`): each MLP whose gate/up and down_proj carry their adapters so runs as
    `SwiGLUInGemm`, its SwiGLU backward one kernel (kernels/swiglu.py); an MLP that cannot is named with the reason."""
    names = {id(m): name for name, m in model.named_modules()}
    done = Fusion()
    for layer in decoder_layers(model):
        for child, projections, group_name, stack in GROUPS:
            parent = getattr(layer, child, None)
            if parent is None or not all(hasattr(parent, p) for p in projections):
                continue
            known = {f"{arch}{'Attention' if child == 'self_attn' else 'MLP'}" for arch in ARCHITECTURES}
            members = [getattr(parent, p) for p in projections]
            where = f"{names[id(parent)]}.{'/'.join(projections)}"
            problems = {p: why for p, m in zip(projections, members, strict=True) if (why := fusable_problem(m))}
            if len({m.in_features for m in members}) > 1:
                problems["in_features"] = "members of different input sizes"
            if len({m.base_layer.weight.dtype for m in members if hasattr(m, "base_layer")}) > 1:
                problems["dtype"] = "members of different dtypes"
            if type(parent).__name__ not in known:
                problems[child] = f"{type(parent).__name__}, not one of {', '.join(sorted(known))}"
            if hasattr(parent, group_name):
                problems[group_name] = "the name is taken"
            if not stack and any(has_dropout(m) for m in members):
                problems["lora.dropout"] = "> 0: nothing to share (one mask per projection, frozen GEMMs kept apart)"
            if problems:
                done.left[where] = "; ".join(f"{p}: {why}" for p, why in problems.items())
                continue
            group = FusedProjections(members, stack)
            parent.register_module(group_name, group)
            start = 0
            for index, member in enumerate(members):
                stop = start + member.out_features
                if stack:
                    member.base_layer = GroupSlice(group, start, stop)  # the member's own weight is freed
                member.__class__ = FusedLoraLinear
                object.__setattr__(member, "gpucert_group", group)  # not a submodule (see GroupSlice)
                member.gpucert_index = index
                start = stop
            done.fused.append(where)
            done.shared_a += group.shared_a
            if adapters_in_gemm and group.shared_a:
                group.extend()
                done.in_gemm += 1
        if adapters_in_gemm and type(layer).__name__.removesuffix("DecoderLayer") in ARCHITECTURES:
            for child, projection in SINGLES:
                module = getattr(getattr(layer, child, None), projection, None)
                if module is not None and fusable_problem(module) is None and not has_dropout(module):
                    put_a_in_gemm(module)
                    done.a_in_gemm += 1
            block = getattr(layer, "mlp", None)
            if mlp and block is not None:
                if (why := mlp_problem(block)) is None:
                    fuse_mlp(block)
                    done.mlp += 1
                else:
                    done.left[names[id(block)]] = f"MLP: {why}"
    if done.in_gemm or done.a_in_gemm:
        # Outside the compiled layers, once per forward of the whole model: A and B change only at optimizer steps.
        model.register_forward_pre_hook(refresh_adapters_in_gemm)
    return done


# Left on a refreshed model by a settled refresh: each carrier of adapters, and what its adapters were when they
# were copied in.
_SETTLED = "_gpucert_settled"


def refresh_adapters_in_gemm(model: nn.Module, *_: Any, settled: bool = False) -> None:
    """Copy every group's B and every single projection's A into the extra columns and rows of their frozen
    matrices (a forward pre-hook; found by walking the model, not remembered, so a copied model refreshes its own).
    One small kernel each (196 for Qwen2-7B): replayed as one CUDA graph instead, a step ran 0.0-0.3 % faster,
    inside the noise (lent H100, docs/OPTIMIZATION.md), so they stay eager.

    `settled`: the trainer's call right after its optimizer step, while the GPU still runs the step. It copies, and
    from then on the pre-hook copies only when an adapter changed as far as it can see. Each carrier (a fused group,
    a projection with its A in the frozen GEMM) looks its adapters up again, through their modules, as the copy
    does: another module or Parameter in an adapter's place, new storage (`.data = ...`) or a moved version counter
    (a checkpoint's load, an optimizer that bumps it) each bring the copy back. Done by the pre-hook at each
    forward's start, the walk over ~2,400 modules and the launches took ~3 ms of host time at each step's start
    with the GPU idle (round eight). Only the trainer settles, and it settles again after each of its optimizer
    steps: torch's fused AdamW, like an in-place write into `.data` (`p.data.add_`), changes a parameter without
    bumping its version, so a loop of one's own, which never settles, keeps the copy at every forward."""
    seen = model.__dict__.get(_SETTLED)
    if not settled and seen is not None and all(_unchanged(*record) for record in seen):
        return
    carriers = [m for m in model.modules() if isinstance(m, FusedProjections | AInGemmLoraLinear)]
    _copy_scaled([item for carrier in carriers for item in carrier.refresh_items()])
    if settled or seen is not None:
        model.__dict__[_SETTLED] = [(c, [_state(w) for w in c.adapter_weights()]) for c in carriers]


def _state(weight: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    return weight, weight._version, weight.data_ptr()


def _unchanged(carrier: FusedProjections | AInGemmLoraLinear, states: list[tuple[torch.Tensor, int, int]]) -> bool:
    live = carrier.adapter_weights()
    return len(live) == len(states) and all(
        w is seen and w._version == version and w.data_ptr() == pointer
        for w, (seen, version, pointer) in zip(live, states, strict=False)
    )


def _copy_scaled(items: list[tuple[torch.Tensor, torch.Tensor, float]]) -> None:
    with torch.no_grad():
        for dst, src, scale in items:
            torch.mul(src, scale, out=dst)  # one kernel: scaled in the source's dtype, cast as it is stored


def clear_pending(model: nn.Module) -> None:
    """Drop the outputs a forward that failed half-way left with its groups (they hold its activations)."""
    for module in model.modules():
        if isinstance(module, FusedProjections):
            module.pending = None
