"""Where does a policy go wrong, and how far is the right move? An offline probe.

Plays greedy episodes on an env with an oracle (``scripted_hints=True`` puts the oracle's next
action in ``info`` without changing what the policy sees). At the first turn of each episode where
the policy's action differs from the oracle's, it scores the oracle's action under the policy (its
exact tokens, in the same prompt) and prints both probabilities.

Reading it: if the right move keeps a fair share of probability at the mistake, sampling finds it
and an RL update has to shift one state-dependent choice; if it has almost none, exploration is
the problem. Measured on the quickstart's SFT policy (README, "What the quickstart gives"): a
median 0.17 for the walkthrough's move against 0.66 for the move taken.

    python scripts/mistake_probe.py --weights runs/quickstart/sft_model.pt
"""

from __future__ import annotations

import argparse
import json
import math



from turngym.agents import make_agent
from turngym.agents.base import SamplingParams
from turngym.rollout import env_info, episode_specs, make_env_factory, rollout
from turngym.trainers.checkpoint import load_weights


def add_policy_args(ap: argparse.ArgumentParser, split: str) -> None:
    """The env and policy arguments."""
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
        policy.model.load_state_dict(load_weights(args.weights))
    return policy


def oracle_env_kwargs(args) -> dict:
    """The env's kwargs with the oracle's next action and the expert-match label in ``info``
    (the policy's view is unchanged)."""
    return {**args.env_kwargs, **({"split": args.split} if args.split else {}), "scripted_hints": True, "expert_labels": True}


def first_mistakes(policy, trajs) -> list[dict]:
    """For each episode, its first turn whose action is not the oracle's, with both probabilities."""
    out = []
    for traj in trajs:
        for k, turn in enumerate(traj.turns[1:], start=1):  # the oracle's action for turn k is in turn k-1's info
            oracle = traj.turns[k - 1].info.get("oracle_action")
            if not oracle or turn.action_text.strip() == oracle.strip():
                continue
            ids = policy.tokenizer.encode(oracle, add_special_tokens=False)
            out.append({"task_id": traj.task_id, "turn": k, "success": traj.success, "action": turn.action_text,
                        "oracle": oracle, "p_action": math.exp(sum(traj.action_logprobs(k))),
                        "p_oracle": math.exp(sum(policy.score(traj.prompt_ids(k), ids)))})
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_policy_args(ap, split="test")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--seed", type=int, default=10_000)
    args = ap.parse_args()

    policy = load_policy(args)
    kwargs = oracle_env_kwargs(args)
    tasks = list(env_info(args.env, **kwargs).task_ids)
    trajs = rollout(policy, make_env_factory(args.env, **kwargs), episode_specs(tasks, args.episodes, seed=args.seed),
                    sampling=SamplingParams(0.0, 1.0, args.max_new_tokens, seed=0), num_envs=16)
    rows = first_mistakes(policy, trajs)
    print(f"greedy success {sum(t.success for t in trajs) / len(trajs):.1%} over {len(trajs)} episodes; "
          f"{len(rows)} episodes leave the oracle's path")
    for r in rows:
        print(f"  {r['task_id']} turn {r['turn']}: took {r['action']!r} p={r['p_action']:.3f}, "
              f"oracle {r['oracle']!r} p={r['p_oracle']:.3f}, {'won' if r['success'] else 'lost'}")
    if rows:
        med = sorted(r["p_oracle"] for r in rows)[len(rows) // 2]
        print(f"median probability of the oracle's move at the first mistake: {med:.3f}")


if __name__ == "__main__":
    main()
