"""Adam for the learners, without torch.optim's start-up cost.

``torch.optim``'s optimizers import ``torch._dynamo`` the first time one is built or stepped
(``add_param_group`` and ``step`` are wrapped to keep ``torch.compile`` out of them): 0.9-1.3 s
on a small CPU, and in a run whose learner lives in the controller (``placement.learner:
controller``) that import sits on the critical path of every launch. :class:`FusedAdam` calls
the kernel ``torch.optim.Adam(fused=True)`` calls (``torch._fused_adam_``) on the same state, so
its updates are the same numbers (tests/test_adam.py compares them step by step), and its
``state_dict`` has torch.optim's layout: a checkpoint of either loads into the other.

Only what the learners use: one parameter group, no AMSGrad, no gradient scaling; CPU or CUDA
float parameters. The learning rate is ``param_groups[0]["lr"]``, as with torch.optim.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["FusedAdam"]


class FusedAdam:
    """Adam (Kingma & Ba) with torch's fused kernel; ``zero_grad`` / ``step`` / ``state_dict`` as torch.optim.

    Args:
        params: the tensors to optimise (their ``.grad`` after ``backward``).
        lr: learning rate (change it through ``param_groups[0]["lr"]``).
        betas: decay rates of the first and second moment estimates.
        eps: added to the second moment's square root.
        weight_decay: L2 penalty added to the gradient (Adam's, not AdamW's decoupled decay).
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):  # fmt: skip
        params = list(params)
        if not params:
            raise ValueError("FusedAdam got no parameters")
        for p in params:
            if not p.is_floating_point():
                raise TypeError(f"FusedAdam optimises float tensors; got one of {p.dtype}")
        # torch.optim's keys, so state_dict() reads the same as torch.optim.Adam(fused=True)'s
        self.param_groups: list[dict[str, Any]] = [{
            "lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
            "fused": True, "decoupled_weight_decay": False, "params": params,
        }]  # fmt: skip
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @property
    def _params(self) -> list[torch.Tensor]:
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def _state_of(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(p)
        if state is None:  # as torch.optim's fused Adam: a float32 step counter on the parameter's device
            state = self.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        return state

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step for every parameter that has a gradient."""
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in self._params:
            if p.grad is not None:
                by_device.setdefault((p.device, p.dtype), []).append(p)
        for params in by_device.values():
            states = [self._state_of(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params, [p.grad for p in params], [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=float(group["lr"]),
                beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                maximize=False, grad_scale=None, found_inf=None,
            )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: per-parameter state keyed by position, the group with positions."""
        params = self._params
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(params)))
        state = {i: dict(self.state[p]) for i, p in enumerate(params) if p in self.state}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`state_dict` of this class or of ``torch.optim.Adam`` over the same parameters."""
        groups = state_dict["param_groups"]
        params = self._params
        if len(groups) != 1 or len(groups[0]["params"]) != len(params):
            sizes = [len(g["params"]) for g in groups]
            raise ValueError(
                f"FusedAdam.load_state_dict: the saved state has parameter groups of sizes {sizes}; "
                f"this optimiser has one group of {len(params)} parameters"
            )
        saved = groups[0]
        for key in ("lr", "betas", "eps", "weight_decay"):
            self.param_groups[0][key] = tuple(saved[key]) if key == "betas" else saved[key]
        self.state = {}
        for position, index in enumerate(saved["params"]):
            entry = state_dict["state"].get(index)
            if entry is None:
                continue
            p = params[position]
            self.state[p] = {
                "step": torch.as_tensor(entry["step"], dtype=torch.float32).to(p.device).reshape(()).clone(),
                "exp_avg": entry["exp_avg"].to(device=p.device, dtype=p.dtype).clone(),
                "exp_avg_sq": entry["exp_avg_sq"].to(device=p.device, dtype=p.dtype).clone(),
            }
