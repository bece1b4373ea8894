"""Does ArCHer's critic tell good actions from bad ones? An offline probe.

Plays episodes with a policy on an env that has an oracle (``expert_labels=True`` marks each step
whose tool calls are the oracle's move from that state, ``info["expert_match"]``, without changing
what the policy sees; the trainer logs the same AUC as ``critic/auc_expert``), computes the critic's
features exactly as ``ArcherTrainer`` does (the frozen reference's hidden states), trains the
critic the same way (TD from a replay buffer, fed in chunks like iterations) on the first two
thirds of the episodes, and scores advantage estimates on the last third by AUC:

- ``oracle``: does A rank the oracle's action above the others?
- ``valid``: does A rank valid actions above invalid ones?

0.5 is chance. Measured on the quickstart's SFT policy (README, "What the quickstart gives"):
Q - V was at chance; the TD advantage r + gamma V(s') - V(s) did better.

    python scripts/critic_probe.py --weights runs/quickstart/sft_model.pt --iterations 6
"""

from __future__ import annotations

import argparse
import json

import torch

from turngym.agents import make_agent
from turngym.agents.base import SamplingParams
from turngym.rollout import env_info, make_env_factory, rollout, task_schedule
from turngym.trainers import functional as Fn
from turngym.trainers.actor import reference_pass
from turngym.trainers.archer import ReplayBuffer, UtteranceCritic, make_target, soft_update, td_loss
from turngym.trainers.sequences import pack_batch


def add_policy_args(ap: argparse.ArgumentParser, split: str) -> None:
    """The env and policy arguments the probes share."""
    ap.add_argument("--env", default="turngym/TextWorld-easy-v0")
    ap.add_argument("--env-kwargs", type=json.loads, default={"tool_format": "xml"})
    ap.add_argument("--split", default=split, help="'' for envs without splits")
    ap.add_argument("--agent", default="default")
    ap.add_argument("--weights", default=None, help="a state dict to load into the policy (e.g. sft_model.pt)")
    ap.add_argument("--max-new-tokens", type=int, default=16)


def load_policy(args):
    """The policy named by ``--agent``, with ``--weights`` loaded if given."""
    policy = make_agent(args.agent)
    if args.weights:
        policy.model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    return policy


def oracle_env_kwargs(args) -> dict:
    """The env's kwargs with the oracle's next action and the expert-match label in ``info``
    (the policy's view is unchanged)."""
    return {**args.env_kwargs, **({"split": args.split} if args.split else {}), "scripted_hints": True, "expert_labels": True}


def play(policy, args) -> list:
    kwargs = oracle_env_kwargs(args)
    tasks = list(env_info(args.env, **kwargs).task_ids)
    trajs = []
    for it in range(args.iterations):
        specs = task_schedule(tasks, args.episodes_per_iter, args.seed, it)
        trajs += rollout(policy, make_env_factory(args.env, **kwargs), specs, num_envs=args.episodes_per_iter,
                         sampling=SamplingParams(args.temperature, 1.0, args.max_new_tokens, seed=it), progress=False)
        print(f"iteration {it}: success {sum(t.success for t in trajs[-len(specs):]) / len(specs):.2f}", flush=True)
    return trajs


def features(policy, trajs, chunk: int):
    """Per flat turn: phi(s), phi(s, a), reward, done, phi(s') and the turn's (traj, k)."""
    parts = []
    for i in range(0, len(trajs), chunk):
        batch = pack_batch(trajs[i : i + chunk], policy.pad_id)
        _, h = reference_pass(policy.model, batch, True, "auto")
        s, sa = h[batch.state_pos[:, 0], batch.state_pos[:, 1]], h[batch.action_pos[:, 0], batch.action_pos[:, 1]]
        rewards = [[turn.reward for turn in t.turns] for t in trajs[i : i + chunk]]
        r, done, nxt = Fn.turn_transitions(batch.turn_refs, rewards, s)
        parts.append((s, sa, r, done, nxt, [(ti + i, k) for ti, k in batch.turn_refs]))
    return [torch.cat([p[j] for p in parts]) for j in range(5)] + [[ref for p in parts for ref in p[5]]]


def train_critic(s, sa, r, done, nxt, n_train: int, args) -> UtteranceCritic:
    torch.manual_seed(args.seed)
    critic = UtteranceCritic(s.shape[1], args.critic_hidden)
    target, opt = make_target(critic), torch.optim.AdamW(critic.parameters(), lr=args.critic_lr)
    buf = ReplayBuffer(len(s), s.shape[1], seed=args.seed)
    bounds = [n_train * j // args.chunks for j in range(args.chunks + 1)]
    for lo, hi in zip(bounds, bounds[1:]):  # data arrives in chunks, as in training iterations
        buf.add(s[lo:hi], sa[lo:hi], r[lo:hi], done[lo:hi], nxt[lo:hi])
        for _ in range(args.critic_updates):
            loss, _ = td_loss(critic, target, buf.sample(64), args.gamma)  # the trainer's own TD loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            soft_update(target, critic, args.tau)
    return critic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_policy_args(ap, split="train")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--episodes-per-iter", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=0.95)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--critic-hidden", type=int, default=256)
    ap.add_argument("--critic-lr", type=float, default=1e-3)
    ap.add_argument("--critic-updates", type=int, default=50, help="TD updates per chunk")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    policy = load_policy(args)
    trajs = play(policy, args)
    s, sa, r, done, nxt, refs = features(policy, trajs, args.episodes_per_iter)
    split = next(i for i, (ti, _) in enumerate(refs) if ti >= len(trajs) * 2 // 3)
    critic = train_critic(s, sa, r, done, nxt, split, args)
    with torch.no_grad():
        v = critic.value(s)
        estimates = {
            "Q - V (ArCHer)": Fn.utterance_advantage(Fn.double_q_min(*critic.q_values(s, sa)), v),
            "r + gamma V(s') - V(s) (advantage=td)": Fn.td_advantage(r, v, critic.value(nxt), done, args.gamma),
        }
    turns = [trajs[ti].turns[k] for ti, k in refs]
    match = [t.info.get("expert_match") for t in turns]
    oracle = torch.tensor([float("nan") if m is None else float(m) for m in match])
    valid = torch.tensor([float(bool(t.info.get("action_valid"))) for t in turns])
    print(f"{len(refs)} turns ({split} to train the critic), {int((~oracle[split:].isnan()).sum())} labelled test turns")
    print(f"{'advantage estimate':42s} {'AUC oracle':>10s} {'AUC valid':>10s}")
    for name, a in estimates.items():
        print(f"{name:42s} {Fn.auc(a[split:], oracle[split:]):10.3f} {Fn.auc(a[split:], valid[split:]):10.3f}")


if __name__ == "__main__":
    main()
