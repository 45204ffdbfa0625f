"""LoRA adapters on a policy's linear layers (Hugging Face ``peft``), and merged plain weights.

``add_lora(policy, rank=8)`` injects low-rank adapters into the ``nn.Linear`` layers a policy
names in ``lora_targets()`` (the MLP policy: its actor layers) and freezes every other weight,
except free action-std parameters (``log_std``), which are tiny and belong to the behaviour. The
policy keeps working in place: ``policy(obs)`` now computes ``W x + (alpha / rank) B A x``.

The rest of the runtime never sees adapters: :func:`merged_state_dict` folds each adapter into
its base weight and returns the policy's *plain* state dict (the keys of the policy before
injection), which is what rollout workers load and what ``init_from`` reads. ``peft`` (and the
``transformers`` it imports, ~5 s) is imported only when LoRA is used.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["add_lora", "lora_parameter_count", "merged_state_dict", "supports_lora"]

_ADAPTER = "default"


def supports_lora(policy: nn.Module) -> bool:
    """Whether the policy names its LoRA target layers (``lora_targets()``)."""
    return callable(getattr(policy, "lora_targets", None))


def add_lora(policy: nn.Module, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0) -> nn.Module:
    """Inject LoRA adapters (in place) into ``policy.lora_targets()`` and freeze the base weights.

    Raises:
        ValueError: the policy has no ``lora_targets()`` (say which policies do), or names a
            module that is not an ``nn.Linear``.
    """
    if not supports_lora(policy):
        raise ValueError(
            f"{type(policy).__name__} does not support LoRA (it has no lora_targets()); "
            "use algo.finetune='full', or a policy that names its LoRA layers, e.g. 'mlp'"
        )
    targets = list(policy.lora_targets())
    modules = dict(policy.named_modules())
    for name in targets:
        if not isinstance(modules.get(name), nn.Linear):
            raise ValueError(f"lora_targets(): {name!r} is not an nn.Linear of {type(policy).__name__}")
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    inject_adapter_in_model(config, policy, adapter_name=_ADAPTER)
    for name, param in policy.named_parameters():
        param.requires_grad = "lora_" in name or name.endswith("log_std")
    return policy


def _lora_layers(policy: nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in policy.named_modules() if isinstance(m, LoraLayer)}


def merged_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's plain state dict, adapters folded into their base weights (detached copies).

    For a policy without adapters this is just a detached copy of ``state_dict()``.
    """
    state = {k: v.detach().clone() for k, v in policy.state_dict().items() if "lora_" not in k}
    plain = {k.replace(".base_layer.", "."): v for k, v in state.items()}
    if "lora_" not in "".join(policy.state_dict()):
        return plain
    with torch.no_grad():
        for name, layer in _lora_layers(policy).items():
            if _ADAPTER in layer.lora_A:
                plain[f"{name}.weight"] = plain[f"{name}.weight"] + layer.get_delta_weight(_ADAPTER).detach()
    return plain


def lora_parameter_count(policy: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in policy.parameters())
