"""Existing Ray clusters, sweeps sized to them, and limits checked before work (real Ray).

The cheap cases run by default: a dead or malformed ``--address``, sweep files refused before
Ray starts, placement groups laid out as RLlib expects, a sweep whose trials fail (exit 1,
errors shown) and one with a remote env runner. ``--slow`` adds a two-node Ray cluster
started on this host (``ray start --head`` + ``ray start --address``, each with its own temp
dir and ports, stopped by the PIDs they started, never ``ray stop``): a `ray start` cluster is
joined without ``num_cpus``, a two-trial sweep runs both trials at once, and an app trained
through the gateway (``marl run --address``) runs its episodes in the env runners on both
nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainers.cli import app
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
runner = CliRunner()

TINY_BASE = {
    "topology": "star:2",
    "algorithm": {"train_batch_size": 64, "minibatch_size": 32, "num_epochs": 1},
    "budget": {"iterations": 1},
    "resources": {"num_envs_per_env_runner": 2},
    "logging": {"wandb": "disabled", "progress": False},
    "output": {"checkpoint_every": 0, "plot": False, "transcripts": 0},
}


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything starts Ray; RAY_ADDRESS restored afterwards."""
    import trainers.cluster
    import trainers.run.loop

    def refuse(*args: Any, **kwargs: Any) -> bool:
        raise AssertionError("Ray was started")

    monkeypatch.setattr(trainers.run.loop, "ensure_ray", refuse)
    monkeypatch.setattr(trainers.cluster, "ensure_ray", refuse)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def invoke(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args), env={"COLUMNS": "1000"})
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output


def sweep_file(tmp_path: Path, **fields: Any) -> Path:
    base = {**TINY_BASE, "output": {**TINY_BASE["output"], "dir": str(tmp_path / "runs")}}
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps({"base": base, **fields}))
    return path


# ----- addresses ----------------------------------------------------------------------------
def test_dead_address_is_a_named_error_before_ray(
    no_ray: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out = invoke("run", "delegate", "--address", "127.0.0.1:1", "--iterations", "1")
    assert code == 2 and "--address='127.0.0.1:1': no Ray cluster answered within 5 s" in out
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    code, out = invoke("sweep", str(sweep_file(tmp_path, param_space={"seed": [0]})))
    assert code == 2 and "RAY_ADDRESS='127.0.0.1:1': no Ray cluster answered" in out
    for bad in ("foo", "10.0.0.1", "10.0.0.1:99999", "http://x:1/y"):
        code, out = invoke("run", "delegate", "--address", bad)
        assert code == 2 and f"--address={bad!r} is not a Ray address: give host:port" in out
    assert "Traceback" not in out


def test_finetune_takes_address(no_ray: None) -> None:
    job = ROOT / "examples" / "finetune_tiny.yaml"
    res = runner.invoke(app, ["finetune", str(job), "--address", "127.0.0.1:1"])
    assert res.exit_code == 2 and "no Ray cluster answered" in res.output, res.output


def test_an_address_that_is_not_ray_fails_with_one_line(tmp_path: Path) -> None:
    """Something listens there but it is no Ray head (Ray's client would wait ~40 s per
    attempt): the error names the address, the port to give and the auth fix."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # the kernel completes the TCP handshake; nobody answers gRPC
    address = f"127.0.0.1:{server.getsockname()[1]}"
    code = textwrap.dedent(
        f"""
        import trainers.cluster
        from trainers.cluster import ClusterError, ensure_ray
        from trainers.configs.experiment import ExperimentConfig
        trainers.cluster.gcs_error.__defaults__ = (1.0,)  # the probe's wait: 3 s, not 15 s
        try:
            ensure_ray(ExperimentConfig(), {address!r})
        except ClusterError as exc:
            print("ClusterError:", exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    finally:
        server.close()
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"--address={address!r} accepts connections but no Ray head answered (" in out.stdout
    assert "RAY_AUTH_MODE=disabled" in out.stdout


def test_a_recorded_cluster_is_used_only_while_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's record of the last `ray start` (``$RAY_TMPDIR/ray/ray_current_cluster``): a stale
    one means a new local Ray (Ray itself would retry it); a live one is joined."""
    from trainers.cluster import cluster_address, joins_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    assert cluster_address() is None and not joins_cluster()  # no record
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    live = f"127.0.0.1:{server.getsockname()[1]}"
    (tmp_path / "ray" / "ray_current_cluster").write_text(live)
    try:
        assert cluster_address() == live and joins_cluster()
        monkeypatch.setenv("RAY_ADDRESS", "local")
        assert cluster_address() is None and not joins_cluster()
        monkeypatch.delenv("RAY_ADDRESS")
    finally:
        server.close()
    assert cluster_address() is None and not joins_cluster()  # the record is stale now


# ----- sweeps: checks before Ray, placement groups ----------------------------------------
@pytest.mark.parametrize(
    ("dimension", "match"),
    [
        ({"loguniform": [0.1]}, r"\{loguniform: \[0.1\]\} needs two numbers \[lo, hi\]"),
        ({"loguniform": [0.0, 0.1]}, r"needs lo > 0 \(a log scale\)"),
        ({"uniform": [0.2, 0.1]}, r"has lo ≥ hi"),
        ({"uniform": ["a", 1]}, r"needs two numbers"),
        ({"randint": [1.5, 3]}, r"needs two numbers"),
        ({"grid": []}, r"no values in"),
        ({"nope": [1, 2]}, r"must be a list or one of"),
    ],
)
def test_bad_ranges_are_config_errors(dimension: dict[str, Any], match: str) -> None:
    from trainers.sweep import validate_space

    base = ExperimentConfig.from_dict(TINY_BASE)
    with pytest.raises(ConfigError, match=match):
        validate_space(base, {"algorithm.lr": dimension}, "random")


def test_sweep_metric_must_be_reported() -> None:
    from trainers.sweep import validate_space

    base = ExperimentConfig.from_dict(TINY_BASE)
    space = {"topology": ["star:2", "star:3"]}
    for metric in ("charts/success", "charts/oracle_fraction", "worker_1/return",
                   "losses/worker/policy_loss", "charts/solved_fraction"):  # fmt: skip
        assert validate_space(base, space, "grid", metric) == 2, metric
    for metric, shown in [
        ("charts/nope", "charts/team_return"),
        ("team_return", "orchestrator/return"),
        ("worker_2/return", "orchestrator/return"),  # star:2 has no worker_2
        ("worker_1/credit", "orchestrator/return"),  # team credit reports none
        ("losses/boss/policy_loss", "losses/orchestrator/policy_loss"),
    ]:
        with pytest.raises(ConfigError, match=rf"metric='{metric}' is not reported.*{shown}"):
            validate_space(base, space, "grid", metric)


def test_documented_metric_keys_are_accepted() -> None:
    """Every key a run wrote is a metric a sweep accepts (guards CHART_KEYS against drift)."""
    from trainers.plan import resolve
    from trainers.sweep import check_metric

    plan = resolve(ExperimentConfig.from_dict({**TINY_BASE, "credit": "loo"}))
    row = {  # the keys flatten_result writes for delegate star:2 with credit
        "charts/iteration", "charts/env_steps", "charts/time_s", "charts/iteration_s",
        "charts/env_steps_per_s", "charts/episode_len", "charts/episodes",
        "charts/team_return", "charts/success", "charts/truncated", "charts/error_rate",
        "charts/timeout_rate", "charts/limit_rate", "charts/oracle", "charts/oracle_fraction",
        "orchestrator/return", "worker_0/credit", "losses/worker/total_loss",
    }  # fmt: skip
    for key in sorted(row):
        check_metric(plan, key)


def test_sweep_cli_refuses_bad_files_before_ray(no_ray: None, tmp_path: Path) -> None:
    for fields, message in [
        ({"param_space": {"algorithm.lr": {"loguniform": [0.1]}}}, "needs two numbers"),
        ({"param_space": {"seed": [0]}, "metric": "charts/nope"}, "metric='charts/nope'"),
        ({"param_space": {"seed": [0]}, "max_concurrent_trials": 0}, "max_concurrent_trials"),
    ]:
        code, out = invoke("sweep", str(sweep_file(tmp_path, **fields)))
        assert code == 2 and message in out, out


@pytest.mark.parametrize(
    "resources",
    [
        {},
        {"num_env_runners": 2},
        {"num_env_runners": 1, "num_learners": 2},
        {"num_env_runners": 1, "num_learners": 1, "num_gpus_per_learner": 0.5},
        {"num_env_runners": 2, "num_gpus_per_env_runner": 0.25},
        {
            "num_env_runners": 1,
            "num_gpus_per_env_runner": 0.5,
            "num_learners": 1,
            "num_gpus_per_learner": 0.5,
        },
    ],
)
def test_trial_bundles_match_rllib(resources: dict[str, Any]) -> None:
    """The placement group is the one RLlib lays out for the algorithm (what it indexes)."""
    from trainers.cluster import trial_bundles

    cfg = ExperimentConfig.from_dict({**TINY_BASE, "resources": resources})
    from trainers.configs.algorithms import ALGORITHMS

    config = ALGORITHMS["PPO"].algorithm_class().get_default_config()
    config.env_runners(
        num_env_runners=cfg.resources.num_env_runners,
        num_cpus_per_env_runner=1,
        num_gpus_per_env_runner=cfg.resources.num_gpus_per_env_runner,
    )
    config.learners(
        num_learners=cfg.resources.num_learners,
        num_gpus_per_learner=cfg.resources.num_gpus_per_learner,
    )
    rllib = ALGORITHMS["PPO"].algorithm_class().default_resource_request(config).bundles
    assert trial_bundles(cfg) == [{k: v for k, v in b.items() if v} for b in rllib]


def test_concurrent_trials_from_cluster_resources() -> None:
    from trainers.cluster import ClusterError, concurrent_trials

    assert concurrent_trials({"CPU": 1.0}, {"CPU": 2.0, "memory": 1e9}) == 2
    assert concurrent_trials({"CPU": 2.0}, {"CPU": 5.0}) == 2
    assert concurrent_trials({"CPU": 1.0, "GPU": 1.0}, {"CPU": 16.0, "GPU": 3.0}) == 3
    with pytest.raises(ClusterError, match=r"a trial needs 3 CPU .* the Ray cluster has 2"):
        concurrent_trials({"CPU": 3.0}, {"CPU": 2.0})
    with pytest.raises(ClusterError, match=r"needs 1 GPU .* has 0"):
        concurrent_trials({"CPU": 1.0, "GPU": 1.0}, {"CPU": 2.0})


# ----- sweeps on the test session's Ray -------------------------------------------------------
@pytest.mark.usefixtures("ray_session")
def test_sweep_with_failing_trials_exits_1_and_shows_errors(tmp_path: Path) -> None:
    path = tmp_path / "flaky.yaml"
    flaky = {
        **TINY_BASE,
        "scenario": "tests.failing_toys:FlakyTool",
        "topology": None,
        "algorithm": {"train_batch_size": 32, "minibatch_size": 16, "num_epochs": 1},
        "output": {**TINY_BASE["output"], "dir": str(tmp_path / "runs")},
    }
    path.write_text(
        json.dumps(
            {
                "base": flaky,
                "name": "flaky",
                "param_space": {"scenario_kwargs.fail": ["never", "always"]},
            }
        )
    )
    code, out = invoke("sweep", str(path))
    assert code == 1, out
    assert "failed trial (scenario_kwargs.fail=always): RunFailed" in out
    assert "tool broke on task" in out
    assert "1 of 2 trials failed (errors above)" in out


@pytest.mark.usefixtures("ray_session")
def test_sweep_with_a_remote_env_runner(tmp_path: Path) -> None:
    """A trial's placement group holds its env runner (this failed every trial before)."""
    from trainers.sweep import sweep

    cfg = ExperimentConfig.from_dict(
        {**TINY_BASE, "resources": {"num_env_runners": 1, "num_envs_per_env_runner": 2},
         "output": {**TINY_BASE["output"], "dir": str(tmp_path / "runs")}}
    )  # fmt: skip
    result = sweep(cfg, {"seed": [0]}, name="remote", show=False)
    assert not result.failed, result.trials
    assert result.trials[0]["iterations"] == 1


# ----- a two-node Ray cluster on this host ----------------------------------------------------
def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class LocalCluster:
    """``ray start --head`` plus ``ray start --address`` nodes on this host, each ``--block``ed
    in its own session with its own temp dir and ports; :meth:`stop` ends exactly the processes
    they started."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dirs: list[str] = []
        self.address = ""
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
        }
        self.env.pop("RAY_ADDRESS", None)

    def start_node(self, head: bool) -> str:
        base = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths
        temp = os.path.join(base, "ray")  # Ray's default layout under RAY_TMPDIR=base
        os.mkdir(temp)
        self.dirs.append(base)
        gcs, nm, om, agent, grpc, metrics, renv, lo = free_ports(8)
        args = [RAY, "start", "--block", "--num-cpus=1", "--num-gpus=0", f"--temp-dir={temp}",
                f"--node-manager-port={nm}", f"--object-manager-port={om}",
                f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
                f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={renv}",
                f"--min-worker-port={lo}", f"--max-worker-port={lo + 40}",
                "--disable-usage-stats"]  # fmt: skip
        if head:
            self.address = f"127.0.0.1:{gcs}"
            args += ["--head", f"--port={gcs}", "--node-ip-address=127.0.0.1",
                     "--include-dashboard=false"]  # fmt: skip
        else:
            args += [f"--address={self.address}", "--node-ip-address=127.0.0.1"]
        with open(Path(temp) / "ray_start.log", "wb") as log:
            proc = subprocess.Popen(
                args,
                env={**self.env, "RAY_TMPDIR": base},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return temp

    def wait_for(self, cpus: float, timeout_s: float = 240.0) -> None:
        probe = textwrap.dedent(
            f"""
            import ray
            ray.init(address={self.address!r}, logging_level="ERROR", log_to_driver=False)
            print(ray.cluster_resources().get("CPU", 0))
            """
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc, temp in zip(self.procs, self.dirs, strict=True):
                if proc.poll() is not None:
                    log = (Path(temp) / "ray" / "ray_start.log").read_text()[-3000:]
                    raise RuntimeError(f"ray start exited with {proc.returncode}:\n{log}")
            try:
                out = subprocess.run(
                    [sys.executable, "-c", probe],
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=90,
                )
            except subprocess.TimeoutExpired:
                continue
            lines = out.stdout.strip().splitlines()
            if out.returncode == 0 and lines and float(lines[-1]) >= cpus:
                return
            time.sleep(2)
        raise RuntimeError(f"the local Ray cluster did not reach {cpus} CPUs")

    def stop(self) -> None:
        pids = []
        for proc in self.procs:
            pids += [proc.pid, *descendants(proc.pid)]
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)  # ray start --block stops what it started
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for pid in pids:  # anything of ours left (never `ray stop`: other runs share the host)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:  # each node's own session (start_new_session)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for base in self.dirs:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[LocalCluster]:
    cluster = LocalCluster()
    try:
        cluster.start_node(head=True)
        cluster.wait_for(1)
        cluster.start_node(head=False)
        cluster.wait_for(2)
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_ray_start_cluster_is_joined_without_num_cpus(two_nodes: LocalCluster) -> None:
    """No RAY_ADDRESS: ensure_ray finds the `ray start` cluster (Ray records it in
    ``$RAY_TMPDIR/ray/ray_current_cluster``; here the head's own temp dir) and joins it with
    the cluster's CPUs, not this machine's."""
    code = textwrap.dedent(
        """
        import ray
        from trainers.cluster import ensure_ray
        from trainers.configs.experiment import ExperimentConfig
        assert ensure_ray(ExperimentConfig())
        print(ray.cluster_resources()["CPU"], len(ray.nodes()))
        """
    )
    env = {**two_nodes.env, "RAY_TMPDIR": two_nodes.dirs[0]}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["2.0", "2"]


@pytest.mark.slow
def test_two_nodes_run_two_trials_at_once(two_nodes: LocalCluster, tmp_path: Path) -> None:
    path = sweep_file(tmp_path, name="two", param_space={"seed": [0, 1]})
    cmd = [sys.executable, "-m", "trainers.cli", "sweep", str(path), "--address", two_nodes.address]
    out = subprocess.run(cmd, env=two_nodes.env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    spans = []
    for trial in (tmp_path / "runs" / "two").glob("trial_*"):
        # the run directory of a trial on the second node is synced to storage too
        summary = json.loads((trial / "run" / "summary.json").read_text())
        assert summary["status"] == "completed"
        last = json.loads((trial / "result.json").read_text().splitlines()[-1])
        spans.append((last["timestamp"] - last["time_total_s"], last["timestamp"]))
    assert len(spans) == 2
    (a0, a1), (b0, b1) = spans
    assert min(a1, b1) - max(a0, b0) > 1.0, spans  # the trials overlapped: one node each


@pytest.mark.slow
def test_an_app_trains_on_the_cluster_through_its_env_runners_gateways(
    two_nodes: LocalCluster, tmp_path: Path
) -> None:
    """``marl run --address`` trains the ``openai``-SDK router app (an ``AppScenario``: the
    router learns, the worker is frozen) for 2 iterations with two remote env runners, one on
    each node of the cluster: every episode's app ran inside an env runner's Ray actor (never
    the driver) and reached that runner's own gateway on the loopback address; both runners
    (both nodes) ran episodes."""
    from configs import grpo_app_config

    log = tmp_path / "where.jsonl"
    config = grpo_app_config(
        tmp_path,
        "tests.apps.openai_router:located_scenario",
        {
            "router": {"agents": ["router"], "model": {"type": "llm"}},
            "worker": {"agents": ["worker"], "model": {"type": "llm", "tiny_seed": 1}},
        },
        ["router"],
        scenario_kwargs={"log": str(log)},
        resources={"num_env_runners": 2},  # one CPU each: one on each node
    ).to_dict()
    config["output"]["name"] = "app"
    path = tmp_path / "app.yaml"
    path.write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "trainers.cli", "run", "--config", str(path),
           "--address", two_nodes.address]  # fmt: skip
    driver = subprocess.Popen(
        cmd, env=two_nodes.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out = driver.communicate(timeout=900)[0].decode()
    assert driver.returncode == 0, out[-4000:]
    run_dir = tmp_path / "runs" / "app"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iterations"] == 2, summary
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/episodes"] for r in rows] == [4, 4], rows
    assert all(r["charts/error_rate"] == 0 for r in rows), rows
    for r in rows:  # the router learnt (in the driver), the frozen worker did not
        assert any(k.startswith("losses/router/") for k in r), sorted(r)
        assert not any(k.startswith("losses/worker/") for k in r), sorted(r)
    runs = [json.loads(x) for x in log.read_text().splitlines()]
    # before Ray starts, the plan plays one trial episode in the driver (trainers.budgets: the
    # prompt budgets a chat app's calls need); every training episode runs in a Ray actor
    trial = [w for w in runs if w["actor"] is None]
    assert len(trial) <= 1, runs
    where = [w for w in runs if w["actor"] is not None]
    assert len(where) == 8, where  # one app run per episode
    assert driver.pid not in {w["pid"] for w in where}
    assert all(w["actor"] and w["node"] for w in where), where  # inside Ray actors
    runners = {(w["pid"], w["actor"], w["node"], w["base_url"]) for w in where}
    assert len(runners) == 2, runners  # two runners, each app at its own runner's gateway
    assert len({node for _, _, node, _ in runners}) == 2, runners  # one on each node
    assert len({url for *_, url in runners}) == 2, runners
    assert all(url.startswith("http://127.0.0.1:") for *_, url in runners), runners
