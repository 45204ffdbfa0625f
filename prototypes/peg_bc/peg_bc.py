"""End to end: DART-style noisy expert demos -> BC MLP on hole-relative features -> seeded evaluation.
usage: peg_bc.py [--demos 200] [--noise 0,0.02,0.05,0.1,0.2] [--feat feat|generic] [--steps 10000] ..."""
import argparse, time
from common import *
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument('--demos', type=int, default=200); p.add_argument('--demo_seed', type=int, default=1)
p.add_argument('--noise', default='0,0.02,0.05,0.1,0.2'); p.add_argument('--feat', default='feat')
p.add_argument('--steps', type=int, default=10000); p.add_argument('--hidden', default='256,256,256')
p.add_argument('--lr', type=float, default=1e-3); p.add_argument('--bs', type=int, default=512)
p.add_argument('--norm', type=int, default=1); p.add_argument('--sched', default='onecycle')
p.add_argument('--eval_seeds', default='20000'); p.add_argument('--eval_eps', type=int, default=40)
a = p.parse_args()
T0 = time.time()
data, _ = collect(a.demos, a.demo_seed, tuple(float(x) for x in a.noise.split(',')))
t_collect = time.time() - T0
phi = (lambda o: feats(o, raw=True)) if a.feat == 'feat' else (lambda o: feats_generic(o, raw=True))
X = phi(data['obs']); Y = data['act'].astype(np.float32)
mu, sd = (X.mean(0), X.std(0) + 1e-3) if a.norm else (np.zeros(X.shape[1], np.float32), np.ones(X.shape[1], np.float32))
Xn, Yt = torch.tensor((X - mu) / sd), torch.tensor(Y)
torch.manual_seed(0)
layers, d_in = [], X.shape[1]
for h in map(int, a.hidden.split(',')):
    layers += [nn.Linear(d_in, h), nn.ReLU()]; d_in = h
net = nn.Sequential(*layers, nn.Linear(d_in, 7))
opt = torch.optim.Adam(net.parameters(), lr=a.lr)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps, pct_start=0.05) if a.sched == 'onecycle' else torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
g = torch.Generator().manual_seed(0)
t1 = time.time()
for it in range(a.steps):
    idx = torch.randint(0, len(Xn), (a.bs,), generator=g)
    loss = ((net(Xn[idx]) - Yt[idx]) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
t_train = time.time() - t1
print(f"train: {len(Xn)} frames, {X.shape[1]} features, final loss {loss.item():.6f}, {t_train:.0f}s", flush=True)
net.eval()
def policy(o):
    with torch.no_grad():
        return net(torch.tensor((phi(o) - mu) / sd)).numpy()
torch.save(dict(state_dict=net.state_dict(), mu=mu, sd=sd, args=vars(a)), f"policy_{a.feat}_{a.demos}.pt")
t2 = time.time()
rates = [evaluate(policy, a.eval_eps, int(s)) for s in a.eval_seeds.split(',')]
t_eval = time.time() - t2
print(f"RESULT {vars(a)} success {rates} collect {t_collect:.0f}s train {t_train:.0f}s eval {t_eval:.0f}s total {time.time()-T0:.0f}s")
