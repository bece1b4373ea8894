"""Car Dealer: the message reader, the reward formula and the buyer's limits by hand, each buyer
background's rule, the scripted oracle reaching the best band, random play, and a model buyer."""

import pytest

import turngym
from turngym.agents import OracleAgent, RandomAgent
from turngym.envs.games.car_dealer import (
    Buyer,
    band_of,
    make_buyers,
    read_message,
    reward_of,
)
from turngym.rollout import episode_specs, rollout


def _env(buyer: Buyer, **kw):
    env = turngym.make("turngym/CarDealer-v0", split="test", **kw)
    u = env.unwrapped
    u._buyers["hand"] = buyer  # a buyer written by hand, so the numbers below are known
    u.task_ids.append("hand")
    env.reset(seed=0, options={"task_id": "hand"})
    return env, u


def test_read_message():
    s = read_message("I have a Mercedes SUV with heated seats and a backup camera. Offer: $32,500")
    assert (s.brand, s.car_type, s.price) == ("Mercedes-Benz", "SUV", 32500.0)
    assert s.features == {"Heated seats", "Backup camera"} and s.topics == []
    assert read_message("my offer is 45k").price == 45000.0
    assert read_message("Offer 27000 dollars").price == 27000.0
    assert read_message("It costs $30,000.").price is None  # only "offer ..." is an offer
    assert read_message("A Honda minivan?").car_type == "Minivan" and read_message("a Ford van").car_type == "Van"
    q = read_message("What brand and type of car do you want, and what is your budget?")
    assert q.topics == ["brand", "type", "budget"] and q.brand is None
    assert read_message("I can give you a discount").discount


def test_reward_formula_and_bands_by_hand():
    assert reward_of(None, 30000) == 0.0
    assert reward_of(27000, 30000) == pytest.approx(0.9)
    assert reward_of(50000, 50000) == 1.0
    assert [band_of(x) for x in (0.0, 0.5, 0.8, 0.85, 0.9, 0.99, 1.0)] == ["none", "low", "fair", "fair", "good", "good", "best"]


def test_discount_buyer_limit_and_rule_by_hand():
    env, u = _env(Buyer("discount", "BMW", "Sedan", ("Bluetooth", "Heated seats"), 50000))
    # right brand, wrong type, one of two features: fit = (1 + 0 + 1/2) / 3 = 0.5 -> R = 50000 * (0.8 + 0.2 * 0.5) = 45000
    obs, r, term, _, info = env.step("I have a BMW coupe with Bluetooth. Offer: $44,000")
    assert u.fit() == pytest.approx(0.5) and u.limit() == pytest.approx(45000)
    assert not term and "never buy without a discount" in obs[0].content  # below R, but no discount yet
    obs, r, term, _, info = env.step("Offer: $46,000")  # lower than 44,000? no: not a discount
    assert not term and "discount" in obs[0].content
    obs, r, term, _, info = env.step("Offer: $45,500")  # a discount on 46,000, but above R: a counter-offer
    assert not term and "I could do $38,500" in obs[0].content  # round500(45000 * 0.85)
    obs, r, term, _, info = env.step("A special discount for you. Offer: $45,000")
    assert term and info["deal"] and r == pytest.approx(45000 / 50000) and info["band"] == "good"
    assert env.unwrapped.outcome() == pytest.approx(0.9)


def test_specs_buyer_buys_only_the_full_spec():
    env, u = _env(Buyer("specs", "Tesla", "Electric", ("Bluetooth",), 30000))
    obs, r, term, _, _ = env.step("I have a Tesla electric car. Offer: $10,000")
    assert not term and u.limit() is None and "I need: Bluetooth" in obs[0].content
    obs, r, term, _, info = env.step("It has Bluetooth too. Offer: $30,000")
    assert term and r == 1.0 and info["band"] == "best"


def test_impatient_buyer_leaves_and_talk_of_features_costs_double():
    env, u = _env(Buyer("impatient", "Ford", "Truck", ("Remote start",), 70000))
    obs, r, term, _, _ = env.step("Which features do you need?")  # features: costs 2 of 4
    assert u.patience == 2 and not term and "Ford truck, budget $70,000" in obs[0].content
    obs, r, term, _, _ = env.step("Nice weather today.")
    assert u.patience == 1 and not term
    obs, r, term, _, info = env.step("Let me tell you about our features.")
    assert term and r == 0.0 and "I'm leaving" in obs[0].content and info["band"] == "none"
    obs, r, term, _, info = env.step("Offer: $1")
    assert info["action_valid"] is False  # the conversation is over


def test_every_buyer_leaves_after_ten_messages():
    env, u = _env(Buyer("specs", "Audi", "Coupe", ("Leather seats",), 90000))
    for i in range(10):
        obs, _r, term, _, _ = env.step("Hello there.")
        assert term == (i == 9)
    assert "Goodbye" in obs[0].content and u.outcome() == 0.0


def test_splits_are_disjoint_and_cover_every_background():
    train, test = make_buyers("train", 100), make_buyers("test", 100)
    assert not {b.key for b in train.values()} & {b.key for b in test.values()}
    assert {b.personality for b in test.values()} == {"discount", "specs", "impatient"}


def test_scripted_oracle_reaches_the_best_band_and_random_does_not():
    def factory():
        return turngym.make("turngym/CarDealer-v0", split="test", scripted_hints=True)

    tasks = factory().unwrapped.task_ids
    oracle = rollout(OracleAgent(), factory, episode_specs(tasks, len(tasks)), progress=False)
    assert all(t.outcome == 1.0 and t.terminated and t.turns[-1].info["band"] == "best" for t in oracle)
    assert max(len(t.turns) for t in oracle) == 3  # ask, (high price,) offer at the budget
    rand = rollout(RandomAgent(0), factory, episode_specs(tasks, len(tasks)), progress=False)
    assert sum(t.success for t in rand) <= 10 and sum(t.outcome for t in rand) / len(rand) < 0.5


def test_model_buyer_plugs_in(tiny_model):
    from turngym.agents.hf import HFPolicy

    policy = HFPolicy(tiny_model.model, tiny_model.tokenizer)
    env = turngym.make("turngym/CarDealer-llm-v0", buyer=policy, split="test", scripted_hints=True)
    assert env.spec.nondeterministic
    obs, info = env.reset(seed=0)
    assert info["nondeterministic"] is True
    obs, r, term, _, info = env.step("What is your budget?")  # the model speaks for the buyer
    assert info["action_valid"] and obs[0].content.startswith("Buyer: ") and not term
    while not term:  # the oracle's offers are decided by the rules, so it still closes at the budget
        obs, r, term, _, info = env.step(info["oracle_action"])
    assert r == 1.0 and info["band"] == "best"
