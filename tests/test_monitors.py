"""The hacking and collapse monitors: each one's math on hand-computed metric streams, config
errors, and real short training runs where a planted exploit trips a monitor and a clean run
trips none."""

from __future__ import annotations

import json
import math
import re

import pytest
from configs import tiny_config

from scenarios import Outcome
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.monitors import MonitorsConfig
from trainers.configs.typed import ConfigError
from trainers.signals.monitors import (
    MOMENTS,
    Monitors,
    clipped_share,
    episode_length,
    length_values,
    pearson_within,
    slope,
    strongest,
)


def monitors(**sections: object) -> Monitors:
    return Monitors(MonitorsConfig(**sections))  # type: ignore[arg-type]


# ----- the math ---------------------------------------------------------------------------------
def test_pearson_of_one_group_matches_hand_computation() -> None:
    # x = 1, 2, 3; y = 1, 2, 4: Σdx·dy = 3, Σdx² = 2, Σdy² = 42/9, so r = 3 / sqrt(2 · 42/9)
    x, y = [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]
    sums = (sum(x), sum(y), sum(a * a for a in x), sum(b * b for b in y))
    sxy = sum(a * b for a, b in zip(x, y, strict=True))
    r = pearson_within([(3, sums[0], sums[1], sums[2], sums[3], sxy)])
    assert r == pytest.approx(3 / math.sqrt(2 * 42 / 9))
    assert pearson_within([(3, 3.0, 6.0, 3.0, 14.0, 6.0)]) is None  # x constant
    assert pearson_within([(1, 1.0, 1.0, 1.0, 1.0, 1.0)]) is None


def test_episode_length_counts_tokens_before_the_pad_and_decisions() -> None:
    """Text agents (token-id observations and actions, pad ``nvec - 1``): tokens before the
    first pad of each completion; other agents, a ``MultiDiscrete`` choice over a ``Box``
    observation included (delegate's orchestrator): one per decision."""
    import types

    import gymnasium as gym
    import numpy as np
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    def agent(space: gym.Space, actions: list, obs: gym.Space | None = None) -> SingleAgentEpisode:
        obs = obs or gym.spaces.Box(-1, 1, (2,))
        return SingleAgentEpisode(
            observations=[obs.sample() for _ in range(len(actions) + 1)],
            actions=actions,
            rewards=[0.0] * len(actions),
            observation_space=obs,
            action_space=space,
            len_lookback_buffer=0,
        )

    ids = gym.spaces.MultiDiscrete([10] * 4)  # a prompt of 4 token ids, vocab 9 + pad
    text = agent(
        gym.spaces.MultiDiscrete([10, 10, 10]),
        [np.array([1, 2, 9]), np.array([9, 3, 9]), np.array([4, 5, 6])],  # 2 + 0 + 3
        ids,
    )
    choice = gym.spaces.MultiDiscrete([4, 4, 4])  # 3 is a choice here, not a pad
    mixed = gym.spaces.MultiDiscrete([10, 10, 9])  # not one pad id
    other_pad = gym.spaces.MultiDiscrete([11, 11, 11])  # not the observation's ids
    episode = types.SimpleNamespace(
        agent_episodes={
            "text": text,
            "chooser": agent(gym.spaces.Discrete(3), [1, 2]),  # 2
            "box": agent(gym.spaces.Box(-1, 1, (2,)), [np.zeros(2, np.float32)]),  # 1
            "idle": agent(gym.spaces.Discrete(3), []),  # 0
            "delegate": agent(choice, [np.array([3, 3, 1]), np.array([0, 3, 2])]),  # 2
            "mixed": agent(mixed, [np.array([9, 1, 2])], ids),  # 1
            "other_pad": agent(other_pad, [np.array([9, 1, 2])], ids),  # 1
        }
    )
    assert episode_length(episode) == 12
    for a in episode.agent_episodes.values():  # a finished, numpy episode counts alike
        a.to_numpy()
    assert episode_length(episode) == 12


def test_slope_is_least_squares() -> None:
    # x centred −1, 0, 1; y − ȳ = −0.1333, −0.0333, 0.1667: slope = 0.3 / 2
    assert slope([0.0, 0.1, 0.3]) == pytest.approx(0.15)
    assert slope([1.0]) == 0.0


def marl(
    n: int,
    lengths: list[float],
    returns: list[float],
    gold: list[float] | None = None,
    success: list[bool] | None = None,
):
    """An RLlib result whose env-runner sums are those of these episodes (each a success
    unless ``success`` says otherwise), summed as the episode callback sums them."""
    sums: dict = {"episodes": n, "team_return": sum(returns)}
    for i, (x, y) in enumerate(zip(lengths, returns, strict=True)):
        ok = True if success is None else success[i]
        for key, value in length_values(x, Outcome(reward=y, success=ok)).items():
            sums[key] = sums.get(key, 0.0) + value
    if gold is not None:
        sums.update(gold=sum(gold), gold_proxy=sum(returns), gold_episodes=len(gold))
    return {"env_runners": {"marl": sums}}


def test_length_monitor_alarms_once_per_streak() -> None:
    m = monitors()
    long_pays = marl(8, [1, 2, 3, 4, 1, 2, 3, 4], [0, 0.3, 0.6, 0.9, 0, 0.3, 0.6, 1.0])
    row: dict = {"charts/iteration": 1}
    alarms = m.observe(row, long_pays)
    assert row["monitor/length_r"] > 0.99 and row["monitor/length_mean"] == 2.5
    assert [(a.monitor, a.iteration, a.metric) for a in alarms] == [
        ("length", 1, "monitor/length_r")
    ]
    assert "length penalty" in alarms[0].message() and "iteration 1" in alarms[0].message()
    assert m.observe({"charts/iteration": 2}, long_pays) == []  # still on: alarmed already
    no_link = marl(8, [1, 2, 1, 2, 1, 2, 1, 2], [1, 1, 0, 0, 1, 1, 0, 0])  # r = 0
    row = {"charts/iteration": 3}
    assert m.observe(row, no_link) == [] and row["monitor/length_r"] == pytest.approx(0.0)
    assert len(m.observe({"charts/iteration": 4}, long_pays)) == 1  # a new streak
    few = marl(4, [1, 2, 3, 4], [0, 0.3, 0.6, 0.9])  # under min_episodes: not judged
    assert monitors().observe({"charts/iteration": 1}, few) == []


def test_pearson_within_centres_each_group_on_its_own_means() -> None:
    # two groups whose means line up (long = high) but inside which length does not pay:
    # x: (1, 2 | 5, 6), y: (0, 0.2 | 1, 0.8) → within deviations x ±0.5, y ∓0.1 / ±0.1
    a = [2, 3, 0.2, 5, 0.04, 0.4]  # n, Σx, Σy, Σx², Σy², Σxy
    b = [2, 11, 1.8, 61, 1.64, 9.8]
    # within: vx = 0.5 + 0.5, vy = 0.02 + 0.02, cxy = 0.1 − 0.1 = 0
    assert pearson_within([a, b]) == pytest.approx(0.0, abs=1e-9)
    assert pearson_within([(4, 14, 2.0, 66, 1.68, 10.2)]) > 0.9  # pooled: a strong link
    assert pearson_within([a]) == pytest.approx(1.0)  # inside group a, longer pays more
    assert pearson_within([[2, 2, 0, 2, 0, 0]]) is None  # no variation


def test_length_monitor_ignores_longer_successes_but_catches_length_pay() -> None:
    """Issue #25: on the supervisor example a completed handoff is a longer episode *and* a
    success (reward 1 vs 0): the pooled r was ~1, a false alarm. Within each outcome the
    reward does not move with length: no r, no alarm. A bonus for length inside an outcome
    still alarms."""
    m = monitors()
    lengths = [1, 1, 1, 1, 3, 3, 4, 3]
    ok = [False] * 4 + [True] * 4
    row: dict = {"charts/iteration": 1}
    assert m.observe(row, marl(8, lengths, [float(s) for s in ok], success=ok)) == []
    assert "monitor/length_r" not in row and row["monitor/length_mean"] == 2.125
    # an iteration without successes: RLlib reports the succeeded sums logged before as NaN
    nan = marl(4, [1, 1, 2, 3], [0.0] * 4, success=[False] * 4)
    nan["env_runners"]["marl"].update({f"len_succeeded_{k}": math.nan for k in MOMENTS})
    row = {"charts/iteration": 2}
    assert m.observe(row, nan) == [] and "monitor/length_r" not in row
    paid = [0, 0, 0, 0, 1.0, 1.0, 1.3, 1.0]  # one more round, 0.3 more
    row = {"charts/iteration": 3}
    (alarm,) = m.observe(row, marl(8, lengths, paid, success=ok))
    assert alarm.monitor == "length" and row["monitor/length_r"] == pytest.approx(1.0)


def test_length_monitor_keeps_malformed_replies_apart() -> None:
    """finetune_tiny: a well-formed reply is longer than a cut-off one and not penalised
    (reward 0 against −0.1), an honest link; within each class length does not pay."""
    m = monitors()
    sums: dict = {"episodes": 8, "team_return": 0.0}
    episodes = [(2, -0.1, 1), (2, -0.1, 1), (1, -0.1, 1), (2, -0.1, 1)]  # length, reward, errors
    episodes += [(4, 0.0, 0), (4, 0.0, 0), (4, 0.5, 0), (4, 0.5, 0)]
    for x, y, errors in episodes:
        outcome = Outcome(reward=y, success=y > 0, metrics={"format_errors": errors})
        for key, value in length_values(x, outcome).items():
            sums[key] = sums.get(key, 0.0) + value
    row: dict = {"charts/iteration": 1}
    assert m.observe(row, {"env_runners": {"marl": sums}}) == []
    assert "monitor/length_r" not in row  # no class where length and reward both vary


def test_entropy_floor_and_rise() -> None:
    m = monitors(entropy={"floor": 0.1, "rise": 0.5})
    stream = [0.8, 0.6, 1.0, 0.95, 0.05, 0.04]
    found = []
    for it, e in enumerate(stream, 1):
        found += [
            (a.monitor, a.iteration)
            for a in m.observe({"charts/iteration": it, "losses/p/entropy": e})
        ]
    # 0.6 → 1.0 is a rise of 67% > 50%; 0.05 < 0.1 starts a floor streak (0.04 continues it)
    assert found == [("entropy_rise", 3), ("entropy_floor", 5)]


def test_kl_to_start_alarm_only_with_a_max() -> None:
    row = {"charts/iteration": 1, "losses/p/grpo/kl_to_start": 0.3}
    assert monitors().observe(dict(row)) == []
    alarms = monitors(kl={"max": 0.2, "action": "stop"}).observe(dict(row))
    assert [(a.monitor, a.value, a.action) for a in alarms] == [("kl", 0.3, "stop")]


def test_gold_gap_and_trend() -> None:
    m = monitors(gold={"scorer": "gold", "max_gap": 0.25, "max_slope": 0.04, "window": 3})
    # proxy − gold per iteration: 0, 0.05, 0.1 (slope 0.05 > 0.04), 0.3 (gap > 0.25)
    gaps = [0.0, 0.05, 0.1, 0.3]
    found, rows = [], []
    for it, gap in enumerate(gaps, 1):
        row: dict = {"charts/iteration": it}
        result = marl(2, [1, 1], [0.5 + gap, 0.5 + gap], gold=[0.5, 0.5])
        found += [(a.monitor, a.iteration) for a in m.observe(row, result)]
        rows.append(row)
    assert [r["monitor/gold_gap"] for r in rows] == pytest.approx(gaps)
    assert rows[2]["monitor/gold_gap_slope"] == pytest.approx(0.05)
    assert found == [("gold_trend", 3), ("gold_gap", 4)]


def test_tool_call_collapse() -> None:
    m = monitors()
    found = []
    for it, calls in enumerate([0.2, 0.04, 1.5, 0.8, 0.0, 0.0], 1):  # 0.04 before any ≥ 0.5
        found += [
            (a.monitor, a.iteration)
            for a in m.observe({"charts/iteration": it, "charts/calls": calls})
        ]
    assert found == [("tool_calls", 5)]


def test_warmup_off_and_strongest() -> None:
    stream = [{"charts/iteration": 1, "losses/p/entropy": 0.0}] * 2
    m = monitors(warmup=1)
    assert m.observe(dict(stream[0])) == []  # in the warm-up
    assert [a.iteration for a in m.observe({**stream[1], "charts/iteration": 2})] == [2]
    assert monitors(entropy={"action": "off"}).observe(dict(stream[0])) == []
    alarms = monitors(entropy={"action": "checkpoint"}).observe(dict(stream[0]))
    assert strongest(alarms) == "checkpoint" and strongest([]) == "off"


def test_monitor_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=re.escape("monitors.length.action='loud'")):
        ExperimentConfig.from_dict({"monitors": {"length": {"action": "loud"}}})
    with pytest.raises(ConfigError, match=re.escape("monitors.length.max_r must be in -1…1")):
        ExperimentConfig.from_dict({"monitors": {"length": {"max_r": 2}}}).check()
    with pytest.raises(
        ConfigError, match=re.escape("monitors.tool_calls needs 0 ≤ floor < from_at_least")
    ):
        ExperimentConfig.from_dict({"monitors": {"tool_calls": {"floor": 1.0}}}).check()
    with pytest.raises(ConfigError, match=re.escape("monitors.kl.max needs monitors.kl.log: true")):
        ExperimentConfig.from_dict({"monitors": {"kl": {"max": 1.0, "log": False}}}).check()
    cfg = ExperimentConfig.from_dict({"monitors": {"gold": {"scorer": "gold"}}})
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg


# ----- the critic monitor (issue #27) -------------------------------------------------------------
def _stream(m: Monitors, evs: list[float], **losses: float) -> list[tuple[str, int, str]]:
    found = []
    for it, ev in enumerate(evs, 1):
        row = {"charts/iteration": it, "losses/p/vf_explained_var": ev}
        row.update({f"losses/p/{k}": v for k, v in losses.items()})
        found += [(a.monitor, a.iteration, a.metric) for a in m.observe(row)]
    return found


def test_critic_monitor_fires_after_k_low_iterations_past_the_warm_up() -> None:
    m = Monitors(MonitorsConfig(critic={"floor": 0.05, "iterations": 3, "after": 2}))  # type: ignore[arg-type]
    # 1–2 not counted; 3, 4 low; 5 good (reset); 6, 7, 8 low: the third in a row alarms
    evs = [0.0, 0.0, 0.01, 0.02, 0.3, 0.0, 0.04, -0.1, 0.0, 0.2, 0.0]
    assert _stream(m, evs) == [("critic_stalled", 8, "losses/p/vf_explained_var")]
    alarm = m.alarms[0]
    assert alarm.value == pytest.approx(-0.1) and alarm.threshold == 0.05
    text = alarm.message()
    assert "losses/p/vf_explained_var = -0.1" in text and "value_norm: true" in text
    assert "vf_clip_param" in text and "nothing is wrong" in text


def test_critic_monitor_clipped_share() -> None:
    # the old config on spread: clipped loss 7.5 of an unclipped 36 (issue #27)
    assert clipped_share(7.5, 36.0) == pytest.approx(1 - 7.5 / 36)
    assert clipped_share(1.0, 1.0) == 0.0 and clipped_share(1.0, None) is None
    assert clipped_share(0.0, 0.0) is None
    m = Monitors(MonitorsConfig())
    found = _stream(m, [0.5, 0.5], vf_loss=7.5, vf_loss_unclipped=36.0)
    assert found == [("critic_clipped", 1, "monitor/p/vf_clipped")]
    assert "remove vf_clip_param" in m.alarms[0].message()
    quiet = Monitors(MonitorsConfig())
    assert _stream(quiet, [0.5] * 12, vf_loss=0.9, vf_loss_unclipped=0.9) == []


def test_critic_monitor_explained_variance_rule_is_opt_in() -> None:
    """Off by default (a low explained variance is as often an unpredictable return); with
    ``floor`` set and the other defaults (10 iterations after 5) the earliest alarm is at 15,
    once per streak."""
    assert _stream(Monitors(MonitorsConfig()), [-0.5] * 30) == []
    on = MonitorsConfig(critic={"floor": 0.02})  # type: ignore[arg-type]
    assert _stream(Monitors(on), [0.0] * 14) == []
    found = _stream(Monitors(on), [0.0] * 20)
    assert found == [("critic_stalled", 15, "losses/p/vf_explained_var")]


def test_critic_monitor_config_errors() -> None:
    for bad, text in (
        ({"action": "loud"}, "monitors.critic.action='loud'"),
        ({"iterations": 0}, "monitors.critic needs iterations ≥ 1"),
        ({"max_clipped": 1.0}, "monitors.critic.max_clipped must be in [0, 1)"),
        ({"floor": 2.0}, "monitors.critic.floor must be in -1…1"),
    ):
        with pytest.raises(ConfigError, match=re.escape(text)):
            ExperimentConfig.from_dict({"monitors": {"critic": bad}}).check()
    cfg = ExperimentConfig.from_dict({"monitors": {"critic": {"max_clipped": None}}})
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg


# ----- real runs -----------------------------------------------------------------------------
#: the planted exploit must be caught while the training reward exceeds the gold verifier's
#: by at most this much per episode (the exploit pays up to 1.5 for talking)
GAP_BOUND = 0.5


def chatter_config(tmp_path, bonus: float, **monitors: object) -> ExperimentConfig:
    return tiny_config(
        tmp_path,
        batch=256,
        scenario="tests.apps.exploits:Chatter",
        scenario_kwargs={"bonus": bonus},
        algorithm={"lr": 0.01, "train_batch_size": 256, "minibatch_size": 128, "num_epochs": 4},
        budget={"iterations": 12},
        monitors={"gold": {"scorer": "gold", "max_gap": GAP_BOUND}, **monitors},
    )


def test_planted_exploit_trips_the_length_monitor_and_stops(ray_session, tmp_path) -> None:
    from trainers.run.loop import train

    cfg = chatter_config(tmp_path, bonus=0.3, length={"action": "stop"})
    result = train(cfg)
    assert result.status.startswith("stopped: monitor length (monitor/length_r = ")
    first = result.alarms[0]
    assert first["monitor"] == "length" and first["action"] == "stop"
    row = result.history[first["iteration"] - 1]
    assert row["monitor/alarms"] >= 1 and row["monitor/length_r"] > 0.5
    assert 0 < row["monitor/gold_gap"] <= GAP_BOUND  # caught before the gap passed the bound
    assert result.iterations == first["iteration"]  # stopped at once, with a checkpoint
    assert result.final_checkpoint is not None and result.final_checkpoint.exists()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == result.status and summary["alarms"] == result.alarms
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["monitor/length_r"] == row["monitor/length_r"]


def test_clean_run_trips_no_monitor(ray_session, tmp_path) -> None:
    from trainers.run.loop import train

    result = train(chatter_config(tmp_path, bonus=0.0).replace(**{"budget.iterations": 6}))
    assert result.status == "completed" and result.iterations == 6
    assert result.alarms == []
    for row in result.history:
        assert row["monitor/gold_gap"] == pytest.approx(0.0)  # reward is the gold verifier
        # the clean reward is the outcome itself: within an outcome it does not vary, so
        # there is no within-outcome length correlation to report
        assert "monitor/length_mean" in row and "monitor/length_r" not in row
        assert row["monitor/alarms"] == 0


def test_a_length_biased_judge_trips_the_length_monitor(ray_session, tmp_path) -> None:
    """Issue #16: a judge that likes long transcripts (``experiments.judges:length_biased``),
    paid as the whole reward of the clean scenario, trips the length monitor; the gold
    verifier sees the gap it opens."""
    from trainers.run.loop import train

    judge = {"ref": "experiments.judges:length_biased", "kwargs": {"bias": 1.0, "scale": 64}}
    rewards = {"sources": [{"name": "judge", "kind": "judge", "vote": "mean", "judges": [judge]}]}
    cfg = tiny_config(
        tmp_path,
        batch=256,
        scenario="tests.apps.exploits:Chatter",
        scenario_kwargs={"bonus": 0.0},  # the scenario's own reward is clean
        algorithm={"lr": 0.01, "train_batch_size": 256, "minibatch_size": 128, "num_epochs": 4},
        budget={"iterations": 12},
        rewards=rewards,
        monitors={"gold": {"scorer": "gold"}, "length": {"action": "stop"}},
    )
    result = train(cfg)
    assert result.status.startswith("stopped: monitor length"), result.status
    (alarm,) = [a for a in result.alarms if a["monitor"] == "length"]
    row = result.history[alarm["iteration"] - 1]
    assert row["monitor/length_r"] > 0.5
    assert row["charts/reward/judge_failures"] == 0.0
    assert row["monitor/gold_gap"] > 0  # the judge pays for length, gold does not


def test_checkpoint_action_saves_one(ray_session, tmp_path) -> None:
    from trainers.run.loop import train

    # r ≈ 0.3–0.4 already at the random start (a longer episode is paid more)
    cfg = chatter_config(tmp_path, bonus=0.3, length={"action": "checkpoint", "max_r": 0.2})
    cfg = cfg.replace(**{"budget.iterations": 1})
    result = train(cfg)
    assert result.status == "completed" and result.alarms[0]["action"] == "checkpoint"
    assert (result.run_dir / "checkpoints" / "alarm_iter_000001" / "algorithm_state.pkl").exists()


def test_critic_monitor_fires_on_the_old_clipped_config(ray_session, tmp_path) -> None:
    """spread's returns (≈ −25 per agent and episode) under the old config: most of the value
    loss is clipped away from the first iteration; the default clips nothing."""
    from test_value_norm_learner import OLD, _spread

    from trainers.run.loop import train

    old = train(_spread(tmp_path / "old", 2, **OLD))
    (alarm,) = old.alarms
    assert (alarm["monitor"], alarm["metric"], alarm["iteration"]) == (
        "critic_clipped",
        "monitor/agent/vf_clipped",
        1,
    )
    assert alarm["value"] > 0.5 and "vf_clip_param" in alarm["advice"]
    new = train(_spread(tmp_path / "new", 2))
    assert new.alarms == []
    assert [row["monitor/agent/vf_clipped"] for row in new.history] == [0.0, 0.0]


# ----- KL to the starting policy on the GRPO learner (no Ray) ------------------------------------
def test_grpo_learner_logs_kl_to_start_at_kl_coef_zero() -> None:
    import numpy as np
    import torch
    from llm_modules import learner_config
    from ray.rllib.core.columns import Columns
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from scenarios.text_space import TextSpaces
    from trainers.grpo.connectors import ADVANTAGES, GRPO_KEEP
    from trainers.grpo.learner import kl_to_start
    from trainers.signals.monitors import KL_TO_START

    # hand-computed: δ = log π_start − log π = 0, log 2 on the two unmasked tokens
    lp, ref = torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([[0.0, math.log(2), 0.0]])
    mask = torch.tensor([[True, True, False]])
    assert kl_to_start(lp, ref, mask) == pytest.approx((0 + 2 - math.log(2) - 1) / 2)
    assert kl_to_start(lp, None, mask) is None

    spaces = TextSpaces(vocab_size=384, max_prompt_tokens=16, max_new_tokens=6)
    both = (spaces.observation_space, spaces.action_space)
    config = learner_config(spaces, kl_coef=0.0)
    config.learner_config_dict = {**config.learner_config_dict, KL_TO_START: True}
    learner = config.build_learner(spaces={"trained": both, "frozen": both})
    assert set(learner._refs) == {"trained"}  # a frozen copy of the start, for the metric only
    module = learner.module["trained"].unwrapped()
    obs = torch.as_tensor(np.stack([spaces.encode_prompt([5, 6, 7, 8 + i]) for i in range(6)]))
    kls = []
    for it in range(2):
        torch.manual_seed(it)
        with torch.no_grad():
            out = module.forward_exploration({Columns.OBS: obs})
        batch = {Columns.OBS: obs, **out}
        batch[ADVANTAGES] = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
        batch[GRPO_KEEP] = torch.ones(6, dtype=torch.bool)
        numpy_batch = {k: v.numpy() for k, v in batch.items()}
        results = learner.update(
            batch=MultiAgentBatch({"trained": SampleBatch(numpy_batch)}, env_steps=6)
        )
        kls.append(results["trained"]["grpo/kl_to_start"].peek())
    assert kls[0] == pytest.approx(0.0, abs=1e-9)  # still the starting weights
    assert kls[1] > 0  # one update later the policy has moved
    assert "frozen" not in learner._refs
    plain = learner_config(spaces, kl_coef=0.0).build_learner(
        spaces={"trained": both, "frozen": both}
    )
    assert plain._refs == {}  # off unless asked for (train() asks: monitors.kl.log)
