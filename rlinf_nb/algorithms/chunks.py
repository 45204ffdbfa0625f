"""Action chunks: per-env-step rollout arrays to per-decision transitions, as pure numpy functions.

A policy with ``chunk = k > 1`` is asked once per ``k`` env steps (one *decision*) and its ``k``
actions are executed open loop, one per env step. The learner sees one transition per decision:

* **reward** = the undiscounted sum of the step rewards of the chunk that belong to the decision's
  episode (RLinf's ``chunk_level`` reward). Discounting (``gamma``) then applies per decision.
* **done** = the decision's episode ended (terminated or truncated) at one of the chunk's steps.
* **truncated** = that end was a time limit (truncation without termination); the runtime
  bootstraps it with the value of the episode's true final observation.
* After an episode ends inside a chunk the vector env has reset that env; the chunk's remaining
  actions are still applied, to the new episode (open loop), but their rewards are **not**
  credited to the finished decision (they belong to an episode the decision never saw) and any
  further end inside the chunk is not the decision's. The next decision's observation is then
  the env's current observation. Episode metrics count every real env step either way.

Shapes: ``T`` = env steps per env of a rollout, ``k`` = chunk length (``T % k == 0``),
``D = T // k`` decisions, ``N`` = envs. Per-step inputs are ``[T, N]``, outputs ``[D, N]``.
With ``k = 1`` the outputs equal the inputs (``dones = terminated | truncated``, ``truncated &=
~terminated``), so chunk-free rollouts are unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["ChunkedSteps", "aggregate_chunks", "check_chunk_steps", "credited_steps"]


class ChunkedSteps(NamedTuple):
    """One rollout's per-decision rewards and episode ends (see the module docstring).

    Attributes:
        rewards: ``[D, N]`` the credited step rewards summed over each chunk (dtype of the input).
        dones: ``[D, N]`` bool, the decision's episode ended inside the chunk.
        truncated: ``[D, N]`` bool, it ended by a time limit (not a termination).
        end_step: ``[D, N]`` int64, the chunk step ``0..k-1`` where it ended; ``-1`` where it did not.
        credited: ``[T, N]`` bool, the step's reward counts towards its decision.
    """

    rewards: np.ndarray
    dones: np.ndarray
    truncated: np.ndarray
    end_step: np.ndarray
    credited: np.ndarray


def check_chunk_steps(num_steps: int, chunk: int, key: str = "num_steps") -> int:
    """The number of decisions ``num_steps // chunk``; ``ValueError`` naming ``key`` unless it divides."""
    if chunk < 1:
        raise ValueError(f"chunk: got {chunk}, expected an integer >= 1")
    if num_steps % chunk:
        raise ValueError(
            f"{key}: got {num_steps} env steps, expected a multiple of the action chunk length {chunk} "
            f"(each decision executes {chunk} env steps)"
        )
    return num_steps // chunk


def credited_steps(ends: np.ndarray, chunk: int) -> np.ndarray:
    """``[T, N]`` bool: no episode end at an *earlier* step of the same chunk (the step is credited).

    ``ends`` is ``[T, N]`` bool (terminated or truncated at that env step).
    """
    T, N = ends.shape
    D = check_chunk_steps(T, chunk, "ends")
    e = ends.reshape(D, chunk, N).astype(np.int64)
    ended_before = np.cumsum(e, axis=1) - e  # ends at earlier steps of the same chunk
    return (ended_before == 0).reshape(T, N)


def aggregate_chunks(
    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, chunk: int
) -> ChunkedSteps:
    """Per-env-step ``rewards``/``terminated``/``truncated`` (``[T, N]``) to per-decision arrays.

    ``truncated`` may overlap ``terminated`` (a step can be both); such an end counts as a
    termination. Raises ``ValueError`` when ``T`` is not a multiple of ``chunk``.
    """
    if not (rewards.shape == terminated.shape == truncated.shape) or rewards.ndim != 2:
        raise ValueError(
            "aggregate_chunks expects rewards, terminated and truncated of one shape [T, N], got "
            f"{rewards.shape}, {terminated.shape}, {truncated.shape}"
        )
    T, N = rewards.shape
    D = check_chunk_steps(T, chunk, "rewards")
    term = terminated.astype(bool)
    ends = term | truncated.astype(bool)
    credited = credited_steps(ends, chunk)
    summed = np.where(credited, rewards, 0).astype(rewards.dtype).reshape(D, chunk, N).sum(axis=1)
    first = (ends & credited).reshape(D, chunk, N)  # the decision's own end: at most one per chunk
    dones = first.any(axis=1)
    end_step = np.where(dones, first.argmax(axis=1), -1).astype(np.int64)
    time_limit = (ends & ~term).reshape(D, chunk, N)
    trunc = (first & time_limit).any(axis=1)
    return ChunkedSteps(summed.astype(rewards.dtype, copy=False), dones, trunc, end_step, credited)
