"""Shared helpers for the PegInsertionSide BC prototype (not part of the package)."""
import sys, time
import numpy as np
import torch
torch.set_num_threads(1)
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[2]))
from rlinf_nb.envs import make_env
from rlinf_nb.envs.scripted import peginsertion_policy as expert
from rlinf_nb.envs import quaternion as Q

ENV = "maniskill:PegInsertionSide-v1"
KW = dict(obs_mode="state", control_mode="pd_ee_delta_pose", sim_backend="physx_cpu")
_TOP_DOWN = np.array([0.0, 1.0, 0.0, 0.0])


def feats(obs, raw=True):
    """Hole/peg/TCP-relative features of the flat 43-dim state obs (float32 [N, F])."""
    obs = np.asarray(obs, np.float64).reshape(-1, 43)
    n = len(obs)
    tcp_p, tcp_q, peg_p, peg_q = obs[:, 18:21], obs[:, 21:25], obs[:, 25:28], obs[:, 28:32]
    half_len, hole_p, hole_q, radius = obs[:, 32], obs[:, 35:38], obs[:, 38:42], obs[:, 42]
    width = obs[:, 7] + obs[:, 8]
    peg_x, hole_x = Q.rotate(peg_q, [1.0, 0, 0]), Q.rotate(hole_q, [1.0, 0, 0])
    # peg vs hole
    seated = hole_p - hole_x * half_len[:, None]
    d = peg_p - seated                                   # world
    d_h = Q.rotate(Q.conj(hole_q), d)                    # hole frame
    head = peg_p + peg_x * half_len[:, None]
    head_h = Q.rotate(Q.conj(hole_q), head - hole_p)     # head in hole frame
    along = d_h[:, :1]
    lateral = np.linalg.norm(d_h[:, 1:], axis=1, keepdims=True)
    rot_err = Q.rotvec(Q.mul(hole_q, Q.conj(peg_q)))     # world rotvec peg -> hole orientation
    tilt = np.linalg.norm(rot_err, axis=1, keepdims=True)
    # tcp vs peg
    grasp_p = peg_p - peg_x * (0.5 * half_len)[:, None]
    yaw = np.arctan2(peg_x[:, 1], peg_x[:, 0])
    tcp_x = Q.rotate(tcp_q, [1.0, 0, 0])
    yaw = np.where(tcp_x[:, 0] * np.cos(yaw) + tcp_x[:, 1] * np.sin(yaw) < 0, yaw + np.pi, yaw)
    grasp_q = Q.mul(Q.yaw_quat(yaw), np.broadcast_to(_TOP_DOWN, (n, 4)))
    g_err = grasp_p - tcp_p
    g_rot = Q.rotvec(Q.mul(grasp_q, Q.conj(tcp_q)))
    off = tcp_p - peg_p
    off_axis = np.linalg.norm(off - (off * peg_x).sum(1, keepdims=True) * peg_x, axis=1, keepdims=True)
    rel_p = Q.rotate(Q.conj(tcp_q), peg_p - tcp_p)
    rel_q = Q.mul(Q.conj(tcp_q), peg_q)
    rel_q = np.where(rel_q[:, :1] < 0, -rel_q, rel_q)
    # hold error: where the tcp must go for the peg to sit on d=0 with the hole's orientation
    hold_q = Q.mul(hole_q, Q.conj(rel_q))
    hold_corr = peg_p - tcp_p - Q.rotate(hold_q, rel_p)  # (tcp->peg now) - (tcp->peg after re-orienting)
    def ms(x, scales):  # multi-scale clipped copies
        return [np.clip(x / s, -1, 1) for s in scales]
    parts = [
        peg_x, hole_x, tcp_x, Q.rotate(tcp_q, [0, 0, 1.0]),
        *ms(d, (0.1, 0.01, 0.002)), *ms(d_h, (0.1, 0.01, 0.002)), *ms(head_h, (0.1, 0.01)),
        *ms(along + half_len[:, None] + 0.04, (0.05, 0.005)),
        *ms(lateral, (0.01, 0.002)),
        *ms(rot_err, (0.5, 0.05, 0.01)), *ms(tilt, (0.05, 0.01)),
        *ms(g_err, (0.1, 0.01)), *ms(g_err[:, 2:] + 0.06, (0.1, 0.01)), *ms(g_rot, (0.5, 0.08)),
        *ms(off_axis - radius[:, None], (0.02,)), *ms(width[:, None] - 2 * radius[:, None], (0.01,)),
        rel_p * 10, rel_q, *ms(hold_corr, (0.05, 0.005)),
        half_len[:, None] * 10, radius[:, None] * 50, width[:, None] * 10,
    ]
    if raw:
        parts.append(obs)
    return np.concatenate(parts, axis=1).astype(np.float32)


def collect(episodes, seed, noise_stds=(0.0,), num_envs=8, noise_grip=False, log=True):
    """Play the expert with per-episode Gaussian action noise (std drawn from noise_stds); record the
    observed states and the *clean* expert labels. Returns dict(obs, act, ep, std), stats."""
    rng = np.random.default_rng(seed)
    env = make_env(ENV, num_envs, seed=seed, **KW)
    obs = env.reset()
    std = rng.choice(noise_stds, size=num_envs)
    ep_id = np.arange(num_envs)
    next_id = num_envs
    O, A, E, S = [], [], [], []
    done_eps, succ = 0, []
    t0 = time.time()
    while done_eps < episodes:
        a = expert(obs)
        O.append(obs.copy()); A.append(a.copy()); E.append(ep_id.copy()); S.append(std.copy())
        noisy = a.copy()
        k = 7 if noise_grip else 6
        noisy[:, :k] += rng.normal(size=(num_envs, k)) * std[:, None]
        r = env.step(np.clip(noisy, -1, 1))
        obs = r.obs
        done = r.terminated | r.truncated
        if done.any():
            succ += list(zip(std[done], r.successes))
            done_eps += int(done.sum())
            for i in np.flatnonzero(done):
                std[i] = rng.choice(noise_stds); ep_id[i] = next_id; next_id += 1
    env.close()
    d = dict(obs=np.concatenate(O), act=np.concatenate(A), ep=np.concatenate(E), std=np.concatenate(S))
    stats = {}
    for s in noise_stds:
        v = [x for (ss, x) in succ if ss == s]
        stats[float(s)] = (float(np.mean(v)) if v else None, len(v))
    if log:
        print(f"collect: {len(d['obs'])} frames, {done_eps} eps, {time.time()-t0:.0f}s, success by std {stats}", flush=True)
    return d, stats


def evaluate(policy, episodes=40, seed=10_000, num_envs=8, log=True):
    """First episodes/num_envs episodes of each of num_envs envs seeded seed+i; policy: obs->actions."""
    per = episodes // num_envs
    env = make_env(ENV, num_envs, seed=seed, **KW)
    obs = env.reset()
    count = np.zeros(num_envs, int); succ = np.zeros(num_envs, int); steps = 0
    t0 = time.time()
    while (count < per).any():
        r = env.step(policy(obs)); obs = r.obs; steps += 1
        done = r.terminated | r.truncated
        for j, i in enumerate(np.flatnonzero(done)):
            if count[i] < per:
                count[i] += 1; succ[i] += int(r.successes[j])
    env.close()
    rate = succ.sum() / count.sum()
    if log:
        print(f"eval: success {succ.sum()}/{count.sum()} = {rate:.3f} (seed {seed}, {num_envs} envs x {per}) {time.time()-t0:.0f}s", flush=True)
    return rate


def feats_generic(obs, raw=True):
    """Like feats, but only generic geometry: no constants of the expert (grasp point, hover height,
    standoff, its yaw choice, its hold target)."""
    obs = np.asarray(obs, np.float64).reshape(-1, 43)
    tcp_p, tcp_q, peg_p, peg_q = obs[:, 18:21], obs[:, 21:25], obs[:, 25:28], obs[:, 28:32]
    half_len, hole_p, hole_q, radius = obs[:, 32], obs[:, 35:38], obs[:, 38:42], obs[:, 42]
    width = obs[:, 7] + obs[:, 8]
    peg_x, hole_x = Q.rotate(peg_q, [1.0, 0, 0]), Q.rotate(hole_q, [1.0, 0, 0])
    seated = hole_p - hole_x * half_len[:, None]
    d = peg_p - seated
    d_h = Q.rotate(Q.conj(hole_q), d)
    head_h = Q.rotate(Q.conj(hole_q), peg_p + peg_x * half_len[:, None] - hole_p)
    lateral = np.linalg.norm(d_h[:, 1:], axis=1, keepdims=True)
    rot_err = Q.rotvec(Q.mul(hole_q, Q.conj(peg_q)))
    tilt = np.linalg.norm(rot_err, axis=1, keepdims=True)
    off = peg_p - tcp_p
    off_peg = Q.rotate(Q.conj(peg_q), off)
    rel_q = Q.mul(Q.conj(tcp_q), peg_q)
    rel_q = np.where(rel_q[:, :1] < 0, -rel_q, rel_q)
    def ms(x, scales):
        return [np.clip(x / s, -1, 1) for s in scales]
    parts = [
        peg_x, hole_x, Q.rotate(tcp_q, [1.0, 0, 0]), Q.rotate(tcp_q, [0, 1.0, 0]), Q.rotate(tcp_q, [0, 0, 1.0]),
        *ms(d, (0.1, 0.01, 0.002)), *ms(d_h, (0.1, 0.01, 0.002)), *ms(head_h, (0.1, 0.01)),
        *ms(lateral, (0.01, 0.002)), *ms(rot_err, (0.5, 0.05, 0.01)), *ms(tilt, (0.05, 0.01)),
        *ms(off, (0.1, 0.01)), *ms(off_peg, (0.1, 0.01)), rel_q,
        half_len[:, None] * 10, radius[:, None] * 50, width[:, None] * 10,
    ]
    if raw:
        parts.append(obs)
    return np.concatenate(parts, axis=1).astype(np.float32)
