"""Train a BC MLP on expert-labelled data; evaluate on 40 seeded episodes.
usage: train.py data1.npz[,data2.npz] --feat {raw,feat,featraw} --steps N --hidden 256,256,256 --lr 1e-3 --bs 512"""
import argparse, time
from common import *
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument('data'); p.add_argument('--feat', default='featraw'); p.add_argument('--steps', type=int, default=20000)
p.add_argument('--hidden', default='256,256,256'); p.add_argument('--lr', type=float, default=1e-3)
p.add_argument('--bs', type=int, default=512); p.add_argument('--act', default='relu')
p.add_argument('--max_std', type=float, default=9.0); p.add_argument('--eval_eps', type=int, default=40)
p.add_argument('--eval_seed', type=int, default=10_000); p.add_argument('--save', default='')
p.add_argument('--loss', default='mse'); p.add_argument('--wd', type=float, default=0.0)
a = p.parse_args()
torch.manual_seed(0)
t0 = time.time()
ds = [dict(np.load(f)) for f in a.data.split(',')]
obs = np.concatenate([d['obs'] for d in ds]); act = np.concatenate([d['act'] for d in ds])
std = np.concatenate([d['std'] for d in ds])
keep = std <= a.max_std; obs, act = obs[keep], act[keep]
def phi(o):
    o = np.asarray(o, np.float32).reshape(-1, 43)
    if a.feat == 'raw': return o
    if a.feat.startswith('generic'): return feats_generic(o, raw=(a.feat == 'genericraw'))
    return feats(o, raw=(a.feat == 'featraw'))
X = phi(obs); Y = act.astype(np.float32)
mu, sd = X.mean(0), X.std(0) + 1e-3
Xn = torch.tensor((X - mu) / sd); Yt = torch.tensor(Y)
n = len(Xn); print(f"data {n} frames, {X.shape[1]} features", flush=True)
Act = {'relu': nn.ReLU, 'gelu': nn.GELU, 'tanh': nn.Tanh, 'silu': nn.SiLU}[a.act]
layers, d_in = [], X.shape[1]
for h in map(int, a.hidden.split(',')):
    layers += [nn.Linear(d_in, h), Act()]; d_in = h
layers += [nn.Linear(d_in, 7)]
net = nn.Sequential(*layers)
opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=a.wd)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps, pct_start=0.05)
g = torch.Generator().manual_seed(0)
for it in range(a.steps):
    idx = torch.randint(0, n, (a.bs,), generator=g)
    out = net(Xn[idx])
    if a.loss == 'mse': loss = ((out - Yt[idx]) ** 2).mean()
    else: loss = nn.functional.smooth_l1_loss(out, Yt[idx], beta=0.05)
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    if (it + 1) % max(1, a.steps // 5) == 0:
        with torch.no_grad():
            full = ((net(Xn) - Yt) ** 2).mean(0)
        print(f"step {it+1} loss {loss.item():.5f} full-mse per dim {np.round(full.numpy(), 5)} {time.time()-t0:.0f}s", flush=True)
t_train = time.time() - t0
net.eval()
def pol(o):
    with torch.no_grad():
        return net(torch.tensor((phi(o) - mu) / sd)).numpy()
if a.save:
    torch.save(dict(net=net, mu=mu, sd=sd, feat=a.feat), a.save)
rate = evaluate(pol, a.eval_eps, a.eval_seed)
print(f"RESULT {vars(a)} success {rate:.3f} train {t_train:.0f}s total {time.time()-t0:.0f}s")
