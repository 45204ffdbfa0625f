"""The worker classes of a run: env workers, rollout (inference) workers, the learner.

Data between them moves only through channels (see :mod:`.channel`):

* ``obs`` (key = env rank): an env worker's observation, plus the true final
  observations of episodes cut by a time limit at the previous step;
* ``actions`` (key = env rank): the rollout worker's actions, log-probs, values,
  bootstrap values and the weight version that produced them;
* ``trajectories`` (key = env rank): one rollout's [T, N] arrays and episode stats.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from rlinf_nb import tree

from .channel import Channel
from .frames import FramePublisher
from .inference import PolicyServer
from .robot_claims import env_id_for, robot_of
from .robot_control import RobotControl
from .setup_progress import SetupReporter
from .worker import PeerLost, Worker

ABORT = "abort"


def _set_torch_threads() -> None:
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))


class EnvWorker(Worker):
    """Steps ``num_envs`` envs of one spec; never runs the policy itself.

    ``human_command`` runs in its own concurrency group, so a human's take-over reaches the env
    while a rollout is stepping it (no per-step polling).
    """

    concurrency_groups = {**Worker.concurrency_groups, "weights": 1}

    def __init__(self, rank: int, world_size: int, group: str, env_cfg: dict[str, Any], seed: int,
                 record: dict[str, Any] | None = None, compression: dict[str, Any] | None = None,
                 robots: list[str] | None = None, policy: dict[str, Any] | None = None,
                 obs_features: bytes | None = None):  # fmt: skip
        """``policy`` (the run's policy section) makes this worker run its own copy of the policy
        (``placement.env_to_rollout: colocated``); None: a rollout worker answers it. ``obs_features``: a
        shipped feature set (:func:`rlinf_nb.envs.obs_features.install_obs_features`), installed first."""
        super().__init__(rank, world_size, group)
        from rlinf_nb.envs import make_env
        from rlinf_nb.envs.obs_features import install_obs_features

        install_obs_features(obs_features)

        # placement.env.robots: this worker holds robots[rank] and runs env.id with {robot} replaced
        self.robot = robot_of(robots, rank)
        env_cfg = dict(env_cfg, id=env_id_for(env_cfg["id"], self.robot))
        self.env_cfg = env_cfg
        self.seed = seed + 10_007 * rank
        kwargs = dict(env_cfg.get("kwargs") or {})
        if env_cfg.get("render_every"):
            kwargs.setdefault("render_mode", "rgb_array")
        self.env = make_env(
            env_cfg["id"], env_cfg["num_envs"], seed=self.seed, link=env_cfg.get("link"), **kwargs
        )
        self.obs = self.env.reset(seed=self.seed)
        self.recording = _streamer(record, rank, self.env, env_cfg["id"])  # the run's `record:` section
        # the run's `compression.obs` (identity when off, and when the policy is in this process)
        self.obs_codec = _obs_encoder(None if policy else compression, "obs")
        self.frame_codec = _obs_encoder(compression, "frames")  # `compression.frames`, for the dashboard
        # every env.render_every env steps: env 0's camera frames, and its finished episodes (runtime/frames.py)
        self.frame_pub = FramePublisher(rank, int(env_cfg.get("render_every") or 0), self.frame_codec)
        self.frames: Channel | None = None
        # placement.links on the direct path (.links.DirectLink), made on first use
        self.direct_link: Any = None
        self.steps = 0
        self.robots = RobotControl(self.env, env_cfg["id"])  # e-stop; a latched env waits in its reset
        self.policy: PolicyServer | None = None  # colocated inference: weights arrive via offer_weights
        if policy is not None:
            self.policy = PolicyServer(
                policy, self.env.observation_space, self.env.action_space, seed + 7919 * (rank + 1)
            )

    def spaces(self) -> tuple[Any, Any]:
        return self.env.observation_space, self.env.action_space

    @ray.method(concurrency_group="control")
    def ping(self) -> dict[str, Any]:
        """The base ping (on the ``control`` thread, beside a running rollout) plus this worker's robot and env."""
        return {**super().ping(), "robot": self.robot, "env_id": self.env_cfg["id"]}

    @ray.method(concurrency_group="control")
    def human_command(self, env_index: int, cmd: dict[str, Any]) -> dict[str, Any]:
        """Pass ``cmd`` (take_over, action, hand_back, mark) to the human in the loop of env ``env_index``."""
        envs = getattr(self.env, "envs", None)
        if envs is None or not hasattr(envs[0], "human_command"):
            return {
                "ok": False,
                "error": f"env {self.env_cfg['id']!r} has no human in the loop (robot envs only)",
            }
        if not 0 <= env_index < len(envs):
            return {
                "ok": False,
                "error": f"env index {env_index} out of range: this worker has {len(envs)} envs",
            }
        try:
            envs[env_index].human_command(cmd)
        except Exception as exc:  # noqa: BLE001 - reported to the caller as a clear message
            return {"ok": False, "error": str(exc)}
        return {"ok": True}

    @ray.method(concurrency_group="control")
    def robot_command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """E-stop, clear or read this worker's robot envs (see :class:`.robot_control.RobotControl`)."""
        return self.robots.command(cmd)

    def close_recording(self) -> dict[str, Any] | None:
        """Finalize this worker's recording (episodes still running are dropped); None if not recording."""
        if self.recording is None:
            return None
        out, self.recording = self.recording.close(), None
        return out

    def reset(self, seeds: list[int] | None = None) -> None:
        """Reset every env: env ``i`` with ``seeds[i]`` when given, else from the worker's seed."""
        self.obs = self.env.reset(seed=seeds)
        self.frame_pub.reset()

    def rollout(self, num_steps: int, obs_ch: Channel, act_ch: Channel, traj_ch: Channel,
                frames_ch: Channel | None = None, transitions: bool = False, chunk: int = 1,
                acting: str = "sample", prefetch: int = 0) -> dict[str, Any]:  # fmt: skip
        """Run ``num_steps`` steps asking for actions through the ``obs``/``actions`` channels.

        With ``chunk = k``, one observation goes out per ``k`` steps (``num_steps // k`` rounds, and one
        more with ``prefetch``: see :func:`rollout_rounds`).
        """

        def send(msg: dict[str, Any]) -> Callable[[], dict[str, Any]]:
            obs_ch.put(self.rank, msg, block=False)
            return lambda: act_ch.get(self.rank, timeout=None, as_torch=False)  # see serve: an abort wakes it

        return self._rollout(num_steps, send, traj_ch, frames_ch, transitions, before_publish=obs_ch.flush,
                             chunk=chunk, acting=acting, prefetch=prefetch)  # fmt: skip

    def rollout_direct(self, policy: Any, num_steps: int, traj_ch: Channel, frames_ch: Channel | None = None,
                       transitions: bool = False, chunk: int = 1, links: dict[str, Any] | None = None,
                       acting: str = "sample", prefetch: int = 0) -> dict[str, Any]:  # fmt: skip
        """Run ``num_steps`` steps asking the rollout worker ``policy`` (an actor handle) directly.

        One actor call per step (per ``chunk`` steps with action chunks) instead of four channel
        messages: the rollout path is latency-bound. ``links`` (the active ``obs``/``actions`` links of
        ``placement.links``) delays each request and reply (:class:`.links.DirectLink`); the result
        then holds ``link_delays``, the simulated delays of this segment.
        """
        import ray

        def start(msg: dict[str, Any]) -> Callable[[], tuple[dict[str, Any], float]]:
            """Ask the rollout worker now; the returned function waits for ``(reply, service seconds)``."""
            ref = policy._invoke.remote("infer", (msg,), {})

            def receive() -> tuple[dict[str, Any], float]:
                try:
                    report = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                    # the rollout worker died or Ray is restarting it: the controller recovers and repeats
                    raise PeerLost("rollout", f"{type(exc).__name__}: {str(exc)[:300]}") from exc
                if not report["ok"]:
                    raise RuntimeError(
                        f"the rollout worker failed serving env worker {self.rank}:\n{report['error']}"
                    )
                return report["result"], report["elapsed"]

            return receive

        if not links:

            def send(msg: dict[str, Any]) -> Callable[[], dict[str, Any]]:
                receive = start(msg)
                return lambda: receive()[0]

            return self._rollout(num_steps, send, traj_ch, frames_ch, transitions, chunk=chunk,
                                 acting=acting, prefetch=prefetch)  # fmt: skip
        if self.direct_link is None:  # one per worker, so latency draws and bandwidth queues carry on
            from .links import DirectLink

            self.direct_link = DirectLink(links, self.rank)
        else:  # placement.links is live: the latest latency and bandwidth
            self.direct_link.retune(links)
        link = self.direct_link
        out = self._rollout(num_steps, lambda msg: link.submit(start, msg), traj_ch, frames_ch, transitions,
                            chunk=chunk, acting=acting, prefetch=prefetch)  # fmt: skip
        return {**out, "link_delays": link.take_delays()}

    def _colocated_policy(self) -> PolicyServer:
        if self.policy is None:
            raise RuntimeError(
                f"env worker {self.rank} has no colocated policy (env_to_rollout is not colocated)"
            )
        return self.policy

    @ray.method(concurrency_group="weights")
    def offer_weights(self, weights: dict[str, np.ndarray], version: int, replace: bool = False) -> int:
        """Colocated policy: new weights, loaded before its next decision (also while a rollout runs);
        ``replace``: even when they are older than weights already parked (see ``PolicyServer``)."""
        return self._colocated_policy().offer_weights(weights, version, replace)

    def rollout_colocated(self, num_steps: int, traj_ch: Channel, frames_ch: Channel | None = None,
                          transitions: bool = False, chunk: int = 1,
                          weights: tuple[list[ray.ObjectRef], int] | None = None,
                          acting: str = "sample", prefetch: int = 0) -> dict[str, Any]:  # fmt: skip
        """Run ``num_steps`` steps with this worker's own copy of the policy: no call per step.

        ``weights`` (``([ref], version)`` of the controller's last sync) are loaded first when this
        worker's policy is older, e.g. after Ray restarted the worker and the sync's offer missed it.
        """
        server = self._colocated_policy()
        if weights is not None and server.newest_version < weights[1]:
            server.offer_weights(ray.get(weights[0][0]), weights[1])
        # answered at once: a prefetched chunk only moves its observation
        send = answered_at_once(lambda msg: server.answer([msg])[0])
        return self._rollout(num_steps, send, traj_ch, frames_ch, transitions, chunk=chunk, acting=acting,
                             prefetch=prefetch)  # fmt: skip

    def _check_chunkable(self, transitions: bool) -> None:
        """Action chunks (``policy.chunk > 1``) run only on-policy and without a human in the loop."""
        if transitions:
            raise ValueError(
                "policy.chunk > 1: off-policy collection (transitions=True) stores one action per env step; "
                "action chunks run with on-policy algorithms only (ppo, grpo, dapo, reinforcepp)"
            )
        envs = getattr(self.env, "envs", None) or []
        if any(getattr(e, "intervention", None) is not None for e in envs):
            raise ValueError(
                f"policy.chunk > 1: env {self.env_cfg['id']!r} has a human in the loop (an intervention), "
                "whose take-overs act per env step; open-loop action chunks cannot hand over mid-chunk "
                "(use policy.chunk: 1)"
            )

    def _rollout(self, num_steps: int, send: Callable[[dict[str, Any]], Callable[[], dict[str, Any]]],
                 traj_ch: Channel, frames_ch: Channel | None, transitions: bool, before_publish: Any = None,
                 chunk: int = 1, acting: str = "sample", prefetch: int = 0) -> dict[str, Any]:  # fmt: skip
        """Step ``num_steps`` times with actions from the policy; publish the trajectory.

        ``send(msg)`` sends one observation message to the policy and returns what waits for its reply.

        ``transitions=True`` (off-policy) also keeps ``next_obs`` (the true last observation where an
        episode ended) and ``terminated``; it asks for no state values (its learner has critics of its
        own: the batch has no ``values``) and skips the final values-only round.

        ``acting``: how the policy picks actions (:data:`.inference.ACTING_MODES`): ``sample`` from its
        distribution, ``mode`` (its most likely action: evaluation), or ``random`` (uniform random actions,
        the off-policy warm-up of ``algo.random_steps``; the policy still gives the values).

        ``chunk = k > 1`` (action chunks): the policy is asked once per ``k`` env steps (a decision) and
        the reply's ``[N, k, ...]`` actions are applied one per step, open loop. The published batch
        holds ``num_steps // k`` decisions: the obs at each decision, the whole chunk action, the
        chunk's credited rewards summed, its episode end and time-limit bootstrap value (the rules,
        e.g. after an episode ends mid-chunk, are in :mod:`rlinf_nb.algorithms.chunks`). Env-step
        counts and episode stats count real env steps.

        ``prefetch = p`` (``0 < p < k``, real-time chunking): decision ``n + 1`` is asked for ``p`` steps
        before decision ``n``'s chunk runs out, with the observation of that moment, and the env keeps
        stepping while the policy answers; its chunk starts where decision ``n``'s ends. So the stored
        observation of a decision is ``p`` steps older than its first action, and only the first decision
        of a rollout waits for its answer. A decision asked for just before its env's episode ended acts
        in the new episode from the old episode's last observation (counted: ``stale_chunks``). Time-limit
        bootstrap observations travel one message later than without prefetching, so the values-only
        round at the end is two rounds (:func:`rollout_rounds`).
        """
        from rlinf_nb.algorithms.chunks import aggregate_chunks, check_chunk_steps

        T, N, K, P = num_steps, self.env.num_envs, chunk, prefetch
        D = check_chunk_steps(T, K, "num_steps")  # decisions; T when K == 1
        if K > 1:
            self._check_chunkable(transitions)
        if not 0 <= P < K:
            raise ValueError(f"prefetch: got {P}, expected 0 <= prefetch < chunk ({K})")
        self.obs_codec.restart()  # keyframes first: an aborted rollout's last blobs may never have been decoded
        render_every = int(self.env_cfg.get("render_every") or 0)
        buf: dict[str, Any] = {}
        rewards = np.zeros((T, N), np.float32)  # per env step; summed per decision at the end (K > 1)
        dones = np.zeros((T, N), bool)
        truncated = np.zeros((T, N), bool)
        bootstrap = np.zeros((D, N), np.float32)
        ended = np.zeros(N, bool)  # K > 1: the current decision's episode has ended inside its chunk
        ep_returns: list[float] = []
        ep_lengths: list[int] = []
        successes: list[float] = []
        final_obs, final_mask = None, None  # the current decision's time-limit end (its true final obs)
        unsent: list[tuple[int, Any, np.ndarray]] = []  # finished decisions' (index, final obs, mask) to send
        last_values = None
        terminated = np.zeros((T, N), bool)
        next_obs = None
        human = _HumanTally(T, N)
        pending: tuple[Callable[[], dict[str, Any]], Any] | None = None  # the next decision's prefetched ask
        asked_ended = np.zeros(N, bool)  # P > 0: the pending decision's env ended after its obs was taken
        stale_chunks = 0
        # seconds stepping the envs, and asking the policy and waiting for its answers (colocated: computing it)
        clock = {"env": 0.0, "policy": 0.0}

        def ask(value_only: bool) -> tuple[Callable[[], dict[str, Any]], Any]:
            """Send the current observation (and the oldest unsent time-limit ends); returns its waiter."""
            t0 = time.perf_counter()
            end = unsent.pop(0) if unsent else None
            wait = send({"obs": self.obs_codec.encode(self.obs), "sender": self.rank,
                         "final_obs": None if end is None else end[1], "final_mask": None if end is None else end[2],
                         "value_only": value_only, "acting": acting, "with_values": not transitions})  # fmt: skip
            clock["policy"] += time.perf_counter() - t0
            return wait, end

        def receive(asked: tuple[Callable[[], dict[str, Any]], Any]) -> dict[str, Any]:
            wait, end = asked
            t0 = time.perf_counter()
            reply = wait()
            clock["policy"] += time.perf_counter() - t0
            if end is not None and not reply.get(ABORT):
                bootstrap[end[0]] = np.where(end[2], reply["bootstrap_values"], 0.0)
            return reply

        for t in range(T + 1):
            if t == T and transitions:
                break
            d, j = divmod(t, K)  # decision d, step j of its chunk (d == t, j == 0 without chunks)
            if t == T:  # values-only round(s): the last obs's values, the last time-limit ends' bootstraps
                rounds = rollout_rounds(0, P, value_round=True)
                asked = [ask(value_only=True) for _ in range(rounds)]  # all in flight at once
                for waiter in asked:  # in order; after an abort nothing else answers
                    reply = receive(waiter)
                    if reply.get(ABORT):
                        return {"aborted": True}
                last_values = reply["values"]
                break
            if j == 0:
                if pending is None:
                    if "obs" not in buf:  # an array or a dict of arrays (images stay uint8): [D, N, ...]
                        buf["obs"] = tree.zeros(self.obs, lead=(D,))
                    tree.assign(buf["obs"], d, self.obs)
                    pending = ask(value_only=False)
                else:
                    stale_chunks += int(asked_ended.sum())
                reply = receive(pending)
                pending = None
                if reply.get(ABORT):
                    return {"aborted": True}
                for key, value in (("actions", reply["actions"]), ("logprobs", reply["logprobs"]),
                                   ("values", reply.get("values")), ("versions", reply["version"])):  # fmt: skip
                    if value is None:  # off-policy: no state values asked for
                        continue
                    arr = np.asarray(value)
                    if key not in buf:
                        buf[key] = np.zeros((D, N, *arr.shape[1:]) if arr.ndim else (D, N), arr.dtype)
                    buf[key][d] = arr
                actions = reply["actions"]
            if P and j == K - P and d + 1 < D:  # real-time chunking: ask for the next chunk now
                tree.assign(buf["obs"], d + 1, self.obs)
                pending = ask(value_only=False)
                asked_ended[:] = False
            t0 = time.perf_counter()
            res = self.env.step(actions if K == 1 else actions[:, j])
            clock["env"] += time.perf_counter() - t0
            self.steps += N
            stored = buf["actions"][d] if K == 1 else buf["actions"][d][:, j]  # [N, ...]: this step's, a view
            if res.intervened is not None:  # robot envs (a human in the loop only without chunks)
                human.record(t, res, stored)
            if self.recording is not None:
                self.recording.step(self.obs, stored, res)
            rewards[t] = res.reward
            dones[t] = res.terminated | res.truncated
            truncated[t] = res.truncated & ~res.terminated
            terminated[t] = res.terminated
            if P:
                asked_ended |= dones[t]
            if transitions:
                if next_obs is None:
                    next_obs = tree.zeros(res.obs, lead=(T,))
                real = res.obs if res.final_obs is None else tree.where(dones[t], res.final_obs, res.obs)
                tree.assign(next_obs, t, real)
            if K == 1:
                final_mask = truncated[t] if truncated[t].any() and not transitions else None
                final_obs = res.final_obs if final_mask is not None else None
            else:  # only the decision's own episode end bootstraps (the first end inside the chunk)
                own_trunc = truncated[t] & ~ended
                ended |= dones[t]
                if own_trunc.any():
                    final_obs = (
                        res.final_obs
                        if final_mask is None
                        else tree.where(own_trunc, res.final_obs, final_obs)
                    )
                    final_mask = own_trunc if final_mask is None else final_mask | own_trunc
            ep_returns += res.episode_returns
            ep_lengths += res.episode_lengths
            successes += res.successes
            self.obs = res.obs
            if frames_ch is not None and render_every:  # named camera frames + env 0's finished episodes
                self.frame_pub.after_step(self.env, res, self.steps, frames_ch)
            if j == K - 1:  # decision d is over: its time-limit end goes out with a later message
                if final_mask is not None:
                    unsent.append((d, final_obs, final_mask))
                final_obs, final_mask = None, None
                ended[:] = False
        if K > 1:  # per env step -> per decision: credited rewards summed, the decision's episode end
            per_decision = aggregate_chunks(rewards, terminated, truncated, K)
            rewards, dones, truncated = per_decision.rewards, per_decision.dones, per_decision.truncated
        buf.update(rewards=rewards, dones=dones, truncated=truncated, bootstrap_values=bootstrap)
        if transitions:
            buf.update(next_obs=next_obs, terminated=terminated)
        else:
            buf["last_values"] = np.asarray(last_values, np.float32)
        if human.active:
            buf["intervened"] = human.per_decision(human.intervened, K)
            if human.human_mask is not None:  # per action dim (per-arm take-overs): HG-DAgger's labels
                buf["human_mask"] = human.human_mask
        if before_publish is not None:
            before_publish()
        traj_ch.put(self.rank, {"batch": buf, "episode_returns": ep_returns, "episode_lengths": ep_lengths,
                                "successes": successes, "env_steps": T * N, **human.summary(),
                                "obs_codec": self.obs_codec.stats() if self.obs_codec.enabled else None})  # fmt: skip
        self.span_args = {
            "env_steps": T * N,
            "env_s": round(clock["env"], 6),
            "policy_s": round(clock["policy"], 6),
        }
        return {"env_steps": T * N, "episodes": len(ep_returns), "incarnation": self.incarnation,
                "env_s": clock["env"], "policy_s": clock["policy"],
                **({"stale_chunks": stale_chunks} if P else {})}  # fmt: skip


def answered_at_once(ask: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], Any]:
    """A ``send`` for :meth:`EnvWorker._rollout` from ``ask(msg) -> reply``, which answers as it is called."""

    def send(msg: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        reply = ask(msg)
        return lambda: reply

    return send


def rollout_rounds(decisions: int, prefetch: int, value_round: bool) -> int:
    """The messages one env worker sends its policy in a rollout of ``decisions`` decisions.

    One per decision, then the values-only round (``value_round``: on-policy): one message, or two with
    ``prefetch`` (each time-limit end's bootstrap observation then travels one message later, so the last
    two decisions' ends are still unsent when the rollout's steps are done).
    """
    return decisions + (1 + int(prefetch > 0) if value_round else 0)


def _obs_encoder(compression: dict[str, Any] | None, channel: str) -> Any:
    from rlinf_nb.config import build

    from .compression import ChannelCompression, ObsEncoder

    return ObsEncoder(build(ChannelCompression, compression[channel]) if compression else None)


def _streamer(record: dict[str, Any] | None, rank: int, env: Any, env_id: str) -> Any:
    """An :class:`~rlinf_nb.data.run_recording.EpisodeStreamer` at ``<root>/env-<rank>``, or None."""
    if not record or not record.get("enabled"):
        return None
    from rlinf_nb.config import build
    from rlinf_nb.data.run_recording import EpisodeStreamer, RecordConfig

    cfg = build(RecordConfig, record)
    root = f"{cfg.root}/env-{rank}"
    return EpisodeStreamer(root, cfg, env.observation_space, env.action_space, env.num_envs, task=env_id)


class _HumanTally:
    """What a human did during one rollout: flags per step, applied actions, take-overs, clean successes."""

    def __init__(self, T: int, N: int):
        self.active = False
        self.intervened = np.zeros((T, N), bool)
        self.takeovers = 0
        self.clean_successes: list[float] = []  # per ended episode: succeeded with no intervention
        self.episode_intervened: list[bool] = []
        self.arm_steps: dict[str, int] = {}  # per arm path: steps a human drove that arm
        self.human_mask: np.ndarray | None = None  # bool [T, N, A]: action dims a human drove

    def record(self, t: int, res: Any, actions: np.ndarray) -> None:
        """Flag step ``t``; where a human, a hand-back blend or the arm's limits changed the action, store the
        applied one in ``actions`` (``[N, ...]``, a view of the batch's slot for this step)."""
        self.active = True
        self.intervened[t] = res.intervened
        before = self.intervened[t - 1] if t > 0 else np.zeros_like(res.intervened)
        self.takeovers += int(np.sum(res.intervened & ~before))
        if res.intervened_arms is not None:
            for path, n in zip(res.arm_paths, np.sum(res.intervened_arms, axis=0), strict=True):
                self.arm_steps[path] = self.arm_steps.get(path, 0) + int(n)
        if res.human_mask is not None:
            if self.human_mask is None:
                self.human_mask = np.zeros((len(self.intervened), *res.human_mask.shape), bool)
            self.human_mask[t] = res.human_mask
        if res.applied_actions is not None:
            applied = np.asarray(res.applied_actions, actions.dtype).reshape(actions.shape)
            changed = ~np.isclose(applied, np.clip(actions, -1.0, 1.0)).reshape(len(applied), -1).all(-1)
            actions[changed] = applied[changed]
        self.episode_intervened += res.episode_intervened
        if len(res.successes) == len(res.episode_intervened):
            self.clean_successes += [
                s * (not iv) for s, iv in zip(res.successes, res.episode_intervened, strict=True)
            ]

    @staticmethod
    def per_decision(flags: np.ndarray, chunk: int) -> np.ndarray:
        """``[T, N]`` step flags to ``[T // chunk, N]``: set where any step of the decision's chunk has it."""
        T, N = flags.shape
        return flags if chunk == 1 else flags.reshape(T // chunk, chunk, N).any(1)

    def summary(self) -> dict[str, Any]:
        if not self.active:
            return {}
        return {"human": {"intervened_steps": int(self.intervened.sum()), "takeovers": self.takeovers,
                          "episode_intervened": self.episode_intervened,
                          "clean_successes": self.clean_successes, "arm_steps": self.arm_steps}}  # fmt: skip


def resolve_spaces(spaces: tuple[Any, Any] | list[ray.ObjectRef]) -> tuple[Any, Any]:
    """``(obs_space, action_space)``, given as such or as ``[ref]`` to env worker 0's ``spaces()``.

    Passed inside a list, the ref is not a dependency Ray waits for before starting the worker: the
    rollout and learner workers start (and import torch) while the env worker is still building its envs.
    """
    if isinstance(spaces, list):
        return ray.get(spaces[0])
    return spaces


class RolloutWorker(Worker):
    """Policy inference for a set of env workers, with versioned weights."""

    def __init__(self, rank: int, world_size: int, group: str, policy_cfg: dict[str, Any],
                 spaces: tuple[Any, Any] | list[ray.ObjectRef], seed: int):  # fmt: skip
        super().__init__(rank, world_size, group)
        obs_space, action_space = resolve_spaces(spaces)
        self.server = PolicyServer(policy_cfg, obs_space, action_space, seed + 7919 * (rank + 1))

    @property
    def policy(self) -> Any:
        return self.server.policy

    @property
    def version(self) -> int:
        return self.server.version

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> int:
        return self.server.set_weights(weights, version)

    def weights_version(self) -> int:
        """The version of the weights this worker acts with (-1: its initial ones)."""
        return self.server.version

    def serve(self, rounds: int, env_ranks: list[int], obs_ch: Channel, act_ch: Channel) -> dict[str, Any]:
        """Answer ``rounds`` observation rounds from ``env_ranks`` (a rollout's: :func:`rollout_rounds`)."""
        for _ in range(rounds):
            # No timeout: an env may wait in its reset for as long as an e-stop is held. A failed or lost
            # worker makes the controller abort the rollout, and the abort message wakes this read.
            msgs = obs_ch.get_batch(env_ranks, timeout=None, as_torch=False)
            if any(m.get(ABORT) for m in msgs):
                return {"aborted": True}
            act_ch.put_many(list(zip(env_ranks, self.server.answer(msgs), strict=True)), block=False)
        act_ch.flush()
        return {"version": self.version}

    def infer(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Answer one env worker's observation message (the direct rollout path)."""
        return self.server.answer([msg])[0]


class LearnerWorker(Worker):
    """The algorithm's learner: owns the trainable policy and its optimizer."""

    def __init__(self, rank: int, world_size: int, group: str, algorithm: Any, algo_cfg: Any,
                 policy_cfg: dict[str, Any], spaces: tuple[Any, Any] | list[ray.ObjectRef], seed: int):  # fmt: skip
        super().__init__(rank, world_size, group)
        import torch

        from rlinf_nb.algorithms.registry import Algorithm, get_algorithm
        from rlinf_nb.policies import make_policy
        from rlinf_nb.run_config import policy_kwargs

        _set_torch_threads()
        # The controller passes the Algorithm itself (one defined in a notebook is not registered here).
        self.algo = algorithm if isinstance(algorithm, Algorithm) else get_algorithm(algorithm)
        # what the learner's first update would import (torch.optim: torch._dynamo, a second or more on
        # a small CPU): imported now, while the env workers start, not once the spaces are here
        for module in self.algo.learner_imports:
            importlib.import_module(module)

        obs_space, action_space = resolve_spaces(spaces)  # after the imports: they overlap the env's start
        torch.manual_seed(seed)
        self.policy = make_policy(policy_cfg["name"], obs_space, action_space, **policy_kwargs(policy_cfg))
        self.learner = self.algo.make_learner(self.policy, algo_cfg, seed=seed)
        self.version = 0

    def update(self, batch: dict[str, np.ndarray], algo_cfg: Any, progress: float) -> dict[str, Any]:
        out = self.learner.update(batch, algo_cfg, progress)
        self.version += 1
        versions = batch.get("versions")
        if versions is not None:
            out["policy_staleness"] = float(self.version - 1 - np.mean(versions))
        out["policy_version"] = self.version
        return out

    def load_demos(
        self, spec: str, env_cfg: dict[str, Any], seed: int, progress: SetupReporter | None = None,
        obs_features: bytes | None = None,
    ) -> dict[str, float]:  # fmt: skip
        """Fill the learner's demo buffer from ``spec`` (``algo.demos``, e.g. ``scripted:20``) for the run's env;
        ``progress(done, total)`` hears of each demo episode played; ``obs_features``: as the env workers'."""
        from rlinf_nb.envs.obs_features import install_obs_features
        from rlinf_nb.envs.scripted import demo_transitions

        install_obs_features(obs_features)

        transitions, stats = demo_transitions(spec, env_cfg, seed, progress)
        return {**stats, "transitions": float(self.learner.add_demos(transitions))}

    def load_dataset(
        self,
        spec: str,
        env_cfg: dict[str, Any],
        seed: int,
        algo_cfg: Any,
        progress: SetupReporter | None = None,
        obs_features: bytes | None = None,
    ) -> dict[str, Any]:
        """Load the learner's training dataset (``algo.dataset``, e.g. BC's) for the run's env; ``progress(done,
        total)`` hears of each episode recorded when a ``scripted:<n>`` dataset is not cached yet;
        ``obs_features``: as the env workers'."""
        from rlinf_nb.envs.obs_features import install_obs_features

        install_obs_features(obs_features)
        return self.learner.load_dataset(spec, env_cfg, seed, algo_cfg, progress=progress or False)

    def get_weights(self) -> tuple[dict[str, np.ndarray], int]:
        # A learner that reshapes the policy (LoRA adapters) exports the plain weights itself.
        export = getattr(self.learner, "export_weights", None)
        state = export() if export is not None else self.policy.state_dict()
        return {k: v.detach().cpu().numpy() for k, v in state.items()}, self.version

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "learner": self.learner.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> int:
        self.policy.load_state_dict(state["policy"])
        self.learner.load_state_dict(state["learner"])
        self.version = int(state["version"])
        return self.version
