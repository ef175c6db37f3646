"""Tinker's training API through the official `tinker` SDK against a real `tokenwire serve`
with a trainer (`--trainer-model`, the rl extra): each loss checked against a hand computation
on the same weights, steps that learn, a sampler of the trained adapter on the embedded engine
(its samples' weight version naming the checkpoint), checkpoints saved and loaded, and bad
input as the SDK's own exceptions naming the field. The embedded engine's pass only: training
changes the weights this server serves."""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.conftest import TEST_UPSTREAM, LiveServer, _free_port, start_server
from tests.upstreams import hf_model_dir
from tokenwire.api.app import create_app
from tokenwire.config import Settings

# slow: a server with a trainer process, the Hugging Face model `make test` makes, and the
# cookbook's recipes as processes of their own (about 2 min)
pytestmark = [pytest.mark.engine, pytest.mark.slow,
              pytest.mark.skipif(bool(TEST_UPSTREAM), reason="the embedded engine's pass")]

MODEL = "SmolLM2-135M-Instruct"
KEY = "tml-tokenwire-tests"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("training")
    settings = Settings(port=_free_port(), tokenizer_store=tmp / "tokenizers",
                        trainer_model=hf_model_dir(), checkpoint_dir=tmp / "checkpoints")
    app = create_app(settings)
    uv, thread = start_server(app, settings.port)
    yield LiveServer(url=f"http://127.0.0.1:{settings.port}", settings=settings, app=app)
    uv.should_exit = True
    thread.join(timeout=60)


@pytest.fixture(scope="module")
def service(server: LiveServer) -> Iterator[tinker.ServiceClient]:
    sc = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    yield sc
    sc.close("success").result()
    gc.collect()


@pytest.fixture(scope="module")
def trainer(service: tinker.ServiceClient) -> Any:
    # the SDK's defaults: attention, MLP and the unembedding (which SmolLM2 ties to its
    # embeddings: the engine serves an untied copy for the adapter)
    return service.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()


@pytest.fixture(scope="module")
def reference() -> Any:
    """The served model's weights in torch, as the trainer loads them (a new adapter adds
    nothing: its B matrices start at zero)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_model_dir(), dtype=torch.float32)
    return model.eval()


def _ids(trainer: Any, text: str) -> list[int]:
    return trainer.get_tokenizer().encode(text)  # type: ignore[no-any-return]


def _sft(ids: list[int], n_weights: int | None = None) -> types.Datum:
    """Learn each next id of `ids` (`n_weights`: a wrong number of weights, for errors)."""
    n = len(ids) - 1 if n_weights is None else n_weights
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(ids[1:]),
                                       "weights": np.ones(n, dtype=np.float32)})


def test_each_loss_is_its_hand_computation(service: tinker.ServiceClient,
                                           reference: Any) -> None:
    """forward (no step) with cross_entropy, importance_sampling and ppo on one batch of two:
    the trainer's logprobs of the targets, and each loss summed over tokens as Tinker's docs
    define it, against the same sums made here by hand; ppo's ratios straddle its clip."""
    trainer = service.create_lora_training_client(base_model=MODEL, rank=4).result()  # new
    assert trainer.get_info().lora_rank == 4
    texts = ["The capital of France is Paris.", "One, two, three, four, five."]
    rng = np.random.default_rng(7)
    data, by_hand = {}, {}
    for text in texts:
        ids = _ids(trainer, text)
        inp, tgt = ids[:-1], ids[1:]
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([inp])).logits[0]
        lp = torch.log_softmax(logits, -1)[torch.arange(len(tgt)), torch.tensor(tgt)].numpy()
        weights = (np.arange(len(tgt)) >= 2).astype(np.float32)
        adv = rng.normal(size=len(tgt)).astype(np.float32)
        # sampler logprobs a little off the trainer's: ratios from e^-0.5 to e^0.5
        sampled = (lp + rng.uniform(-0.5, 0.5, size=len(tgt))).astype(np.float32)
        by_hand.setdefault("lp", []).append(lp)
        by_hand.setdefault("cross_entropy", []).append(-(weights * lp).sum())
        ratio = np.exp(lp - sampled)
        by_hand.setdefault("importance_sampling", []).append(-(ratio * adv).sum())
        clipped = np.clip(ratio, 0.8, 1.2)
        by_hand.setdefault("ppo", []).append(-np.minimum(ratio * adv, clipped * adv).sum())
        model_input = types.ModelInput.from_ints(inp)
        data.setdefault("cross_entropy", []).append(types.Datum(
            model_input=model_input,
            loss_fn_inputs={"target_tokens": np.array(tgt), "weights": weights}))
        for loss in ("importance_sampling", "ppo"):
            data.setdefault(loss, []).append(types.Datum(
                model_input=model_input,
                loss_fn_inputs={"target_tokens": np.array(tgt), "logprobs": sampled,
                                "advantages": adv}))
        assert ((ratio < 0.8) | (ratio > 1.2)).any() and ((ratio > 0.8) & (ratio < 1.2)).any()
    for loss in ("cross_entropy", "importance_sampling", "ppo"):
        out = trainer.forward(data[loss], loss).result()
        got = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
        for g, want in zip(got, by_hand["lp"], strict=True):
            np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)
        assert out.metrics["loss:sum"] == pytest.approx(sum(by_hand[loss]), rel=1e-4, abs=1e-4)


def test_steps_learn_and_the_sampler_serves_the_checkpoint(server: LiveServer,
                                                           trainer: Any) -> None:
    """Three supervised steps lower the loss; save_weights_and_get_sampling_client serves
    the adapter on the engine: its greedy sample is what /inference/v1/generate now gives
    for the same ids, and that sample's weight version names the checkpoint."""
    datum = _sft(_ids(trainer, "The capital of France is Paris."))
    losses = []
    for _ in range(3):
        fb = trainer.forward_backward([datum], "cross_entropy")
        step = trainer.optim_step(types.AdamParams(learning_rate=1e-3))
        losses.append(fb.result().metrics["loss:sum"])
        assert "grad_norm:mean" in step.result().metrics
    assert losses[2] < losses[1] < losses[0], losses
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = _ids(trainer, "The capital of France is")
    got = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                         sampling_params=types.SamplingParams(max_tokens=6, temperature=0.0),
                         ).result()
    r = httpx.post(f"{server.url}/inference/v1/generate", timeout=60, json={
        "model": MODEL, "token_ids": prompt,
        "sampling_params": {"max_tokens": 6, "temperature": 0.0}})
    (choice,) = r.json()["choices"]
    assert got.sequences[0].tokens == choice["token_ids"]
    (span,) = choice["weight_versions"]
    assert span["version"].startswith("tinker://") and "/sampler_weights/" in span["version"]
    # the engine's logprobs under the adapter are the trainer's (llama.cpp's Q4_1 against its
    # bf16 dequantization: close, not equal), and far from what they were before the steps
    ids = [*datum.model_input.to_ints(), int(datum.loss_fn_inputs["target_tokens"].data[-1])]
    r = httpx.post(f"{server.url}/inference/v1/generate", timeout=60, json={
        "model": MODEL, "token_ids": ids,
        "sampling_params": {"max_tokens": 1, "prompt_logprobs": 0}})
    served = [next(iter(p.values()))["logprob"] for p in r.json()["prompt_logprobs"][1:]]
    trained = trainer.forward([datum], "cross_entropy").result()
    mine = trained.loss_fn_outputs[0]["logprobs"].to_numpy()
    drift = float(np.abs(np.array(served) - mine).max())
    assert drift < 0.15, (served, mine.tolist())  # 0.042 measured
    assert -sum(served) < losses[0] - 2.0, (sum(served), losses)


def test_gradients_sum_until_the_step(service: tinker.ServiceClient, trainer: Any) -> None:
    """Two forward_backward calls then a step move the weights as one call with both batches
    then a step (Tinker's contract: gradients accumulate until optim_step)."""
    a, b = _sft(_ids(trainer, "Red sky at night.")), _sft(_ids(trainer, "Blue sea by day."))
    probe = [_sft(_ids(trainer, "Green grass in spring."))]
    two = service.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    one = service.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    two.forward_backward([a], "cross_entropy").result()
    two.forward_backward([b], "cross_entropy").result()
    two.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    one.forward_backward([a, b], "cross_entropy").result()
    one.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = [m.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
             for m in (two, one)]
    np.testing.assert_allclose(after[0], after[1], rtol=1e-4, atol=1e-4)
    base = service.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    before = base.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    assert np.abs(before.to_numpy() - after[0]).max() > 1e-3  # the step did move them


def test_a_call_sent_twice_runs_once(server: LiveServer, trainer: Any) -> None:
    """A call whose seq_id already ran (an SDK retry after a lost answer) is refused, not
    stepped twice."""
    trainer.forward([_sft(_ids(trainer, "Once."))], "cross_entropy").result()  # seq_id 1 at least
    mid = trainer.get_info().model_id
    r = httpx.post(f"{server.url}/api/v1/optim_step", headers={"X-API-Key": KEY}, json={
        "model_id": mid, "seq_id": 1, "adam_params": {"learning_rate": 0.1}})
    assert r.status_code == 200, r.text
    outcome = httpx.post(f"{server.url}/api/v1/retrieve_future", headers={"X-API-Key": KEY},
                         json={"request_id": r.json()["request_id"]}, timeout=60).json()
    assert outcome["category"] == "user" and "seq_id 1" in outcome["error"], outcome


def test_a_checkpoint_loads_into_a_new_model_with_the_same_outputs(
        service: tinker.ServiceClient, trainer: Any) -> None:
    datum = _sft(_ids(trainer, "Two plus two is four."))
    path = trainer.save_state("ckpt-a").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/ckpt-a")
    loaded = service.create_training_client_from_state_with_optimizer(path).result()
    assert loaded.get_info().model_id != trainer.get_info().model_id
    a = trainer.forward([datum], "cross_entropy").result()
    b = loaded.forward([datum], "cross_entropy").result()
    np.testing.assert_array_equal(a.loss_fn_outputs[0]["logprobs"].to_numpy(),
                                  b.loss_fn_outputs[0]["logprobs"].to_numpy())


def test_a_checkpoint_past_its_ttl_is_deleted(service: tinker.ServiceClient,
                                              trainer: Any) -> None:
    kept = trainer.save_state("kept").result().path
    short = trainer.save_state("short", ttl_seconds=1).result().path
    time.sleep(1.5)
    trainer.save_state("later").result()  # each save sweeps what expired
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint at"):
        service.create_training_client_from_state(short).result()
    assert service.create_training_client_from_state(kept).result().get_info().lora_rank == 8


def test_what_the_trainer_cannot_do_is_refused_by_name(service: tinker.ServiceClient,
                                                       trainer: Any, tmp_path: Path) -> None:
    ids = _ids(trainer, "Hello there, friend.")
    inp, tgt = ids[:-1], ids[1:]
    with pytest.raises(tinker.NotFoundError, match="base_model"):
        service.create_lora_training_client(base_model="no-such-model", rank=4).result()
    good = types.Datum(model_input=types.ModelInput.from_ints(inp),
                       loss_fn_inputs={"target_tokens": np.array(tgt),
                                       "logprobs": np.zeros(len(tgt), dtype=np.float32),
                                       "advantages": np.ones(len(tgt), dtype=np.float32)})
    for loss in ("cispo", "stable_reinforce"):  # (the cookbook's math_rl defaults to the latter)
        with pytest.raises(tinker.RequestFailedError, match=rf"loss_fn '{loss}'.*\(loss_fn\)"):
            trainer.forward_backward([good], loss).result()
    before = trainer.forward([_sft(ids)], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match=r"data\[1\]\.loss_fn_inputs\.weights"):
        trainer.forward_backward([_sft(ids), _sft(ids, n_weights=2)], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError,
                       match=r"data\[0\]\.loss_fn_inputs\.advantages"):
        trainer.forward_backward([types.Datum(
            model_input=types.ModelInput.from_ints(inp),
            loss_fn_inputs={"target_tokens": np.array(tgt),
                            "logprobs": np.zeros(len(tgt), dtype=np.float32)})], "ppo").result()
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\]\.loss_fn_inputs\.mask"):
        trainer.forward([types.Datum(model_input=types.ModelInput.from_ints(inp), loss_fn_inputs={
            "target_tokens": np.array(tgt), "weights": np.ones(len(tgt), dtype=np.float32),
            "mask": np.ones(len(tgt), dtype=np.float32)})], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match=r"loss_fn_config\.clip"):
        trainer.forward([_sft(ids)], "cross_entropy",
                        loss_fn_config={"clip_low_threshold": 0.5}).result()
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\]\.model_input"):
        trainer.forward([_sft([10**6, *ids])], "cross_entropy").result()  # no such id
    with pytest.raises(tinker.RequestFailedError, match=r"longer than the model's context"):
        trainer.forward([_sft(ids * 2000)], "cross_entropy").result()  # 12k ids: over 8192
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # nothing summed: no-op
    after = trainer.forward([_sft(ids)], "cross_entropy").result()
    # the failed steps left the weights (and the gradients) as they were
    np.testing.assert_array_equal(before.loss_fn_outputs[0]["logprobs"].to_numpy(),
                                  after.loss_fn_outputs[0]["logprobs"].to_numpy())
    with pytest.raises(tinker.BadRequestError, match="model_path"):
        service.create_sampling_client(
            model_path="tinker://tw-run-nope/sampler_weights/000001").result()


def test_a_sampler_of_an_older_checkpoint_is_refused(trainer: Any) -> None:
    """The embedded engine holds one set of weights: a sampler of the weights it no longer
    serves says so rather than sampling others."""
    old = trainer.save_weights_and_get_sampling_client().result()
    trainer.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(_ids(trainer, "Hi"))
    with pytest.raises(tinker.BadRequestError, match="sampling_session_id"):
        old.sample(prompt=prompt, num_samples=1,
                   sampling_params=types.SamplingParams(max_tokens=2)).result()


# -- tinker-cookbook's recipes, code unchanged --------------------------------------------------


def _cookbook(server: LiveServer, recipe: str, log: Path, *args: str) -> list[dict[str, Any]]:
    """A recipe of the installed tinker-cookbook against this server (only its documented
    flags set: the local model directory as model_name, a renderer, a small batch); its
    metrics, one row a step."""
    if importlib.util.find_spec("tinker_cookbook") is None:
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
            pytest.fail("tinker-cookbook is not installed: `make test` installs it")
        pytest.skip("tinker-cookbook is not installed")
    env = {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": KEY,
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TINKER_TELEMETRY": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", f"tinker_cookbook.recipes.{recipe}.train",
         f"model_name={hf_model_dir()}", "renderer_name=qwen3_instruct", "lora_rank=8",
         "save_every=0", "eval_every=0", f"log_path={log}", "behavior_if_log_dir_exists=delete",
         *args], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    (final,) = [json.loads(line) for line in (log / "checkpoints.jsonl").read_text()
                .splitlines() if json.loads(line).get("name") == "final"]
    # the recipe's last sampler checkpoint is what the engine serves now
    r = httpx.post(f"{server.url}/inference/v1/generate", timeout=60, json={
        "model": MODEL, "token_ids": [1, 2], "sampling_params": {"max_tokens": 1}})
    assert r.json()["choices"][0]["weight_versions"][0]["version"] == final["sampler_path"]
    return rows


def test_the_cookbooks_rl_recipe_runs_unchanged(server: LiveServer, tmp_path: Path) -> None:
    """math_rl on its arithmetic environment, two steps of 2 groups x 4 samples: each step's
    reward, and the KL between the sampler's logprobs and the trainer's on the sampled ids
    (the cookbook's own check that it trains on what was sampled) near zero."""
    rows = _cookbook(server, "math_rl", tmp_path / "rl", "env=arithmetic", "group_size=4",
                     "groups_per_batch=2", "max_tokens=8", "learning_rate=1e-4",
                     "loss_fn=importance_sampling", "max_steps=2")
    rows = [row for row in rows if "env/all/reward/total" in row]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        assert -1.0 <= row["env/all/reward/total"] <= 1.2
        assert abs(row["optim/kl_sample_train_v1"]) < 0.05, row  # 0.005 measured


def test_the_cookbooks_supervised_recipe_runs_unchanged(server: LiveServer,
                                                        tmp_path: Path) -> None:
    """chat_sl on the conversations file the cookbook ships: two steps of 4, each one's mean
    NLL from the trainer's logprobs."""
    import tinker_cookbook

    data = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    rows = _cookbook(server, "chat_sl", tmp_path / "sl", f"dataset={data}", "batch_size=4",
                     "max_length=512", "learning_rate=1e-4", "lr_schedule=constant",
                     "max_steps=2")
    rows = [row for row in rows if "train_mean_nll" in row]
    assert [row["step"] for row in rows] == [0, 1]
    assert all(0 < row["train_mean_nll"] < 10 and math.isfinite(row["train_mean_nll"])
               for row in rows)


# -- last: it ends the trainer process the module shares ------------------------------------


def _pid_of(socket: str) -> int:
    """The process whose command line names `socket` (the trainer's)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and socket.encode() in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except OSError:
            continue
    raise LookupError(socket)


def test_a_trainer_that_dies_fails_its_future_and_the_next_call_starts_another(
        server: LiveServer, service: tinker.ServiceClient) -> None:
    """SIGKILL the trainer process mid-batch: the batch's future fails (never left pending),
    the models it held are gone (404 naming model_id), and the next call starts a new one."""
    trainer = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    ids = _ids(trainer, "A long sentence to train on, again and again. " * 20)
    batch = trainer.forward_backward([_sft(ids)] * 24, "cross_entropy")
    time.sleep(1.5)  # queued and running (24 x ~250 tokens: several seconds here)
    os.kill(_pid_of(server.app.state.tinker.training.socket), signal.SIGKILL)  # type: ignore[attr-defined]
    with pytest.raises(tinker.RequestFailedError, match="trainer process ended"):
        batch.result()
    with pytest.raises(tinker.RequestFailedError, match="model_id"):
        trainer.forward([_sft(ids)], "cross_entropy").result()
    again = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    assert again.forward([_sft(ids)], "cross_entropy").result().metrics["loss:sum"] > 0
