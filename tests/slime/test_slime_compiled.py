"""``torch_compile: true``: the TIS hook's device work as one compiled graph (:mod:`mismatch_ctrl.compiled`).

The compiled hook must give the eager hook's results (the same code traced: bit-identical with ``aot_eager``, which
traces and functionalises the graph as the production backend does but runs it with aten's kernels;
within float32 rounding with ``inductor``, whose fused kernels sum in another order), serve micro-batches of every
size with a few graphs, hold no host transfer and no ``torch.distributed`` call (its gathers are functional
collectives, recorded in the graph), leave every rare path (dropped tokens, NaN ``pg_loss``) to the eager hook, and
run eager, with one warning, where compiling fails.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from slime_data import View, make_args, make_batch, method, micro_batches, rollout_data
from test_slime_device import CUDA, CudaSyncs, Syncs, assert_same, moved, run_hooks

from mismatch_ctrl import compiled
from mismatch_ctrl.dist import GroupGather, Reducers
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.hostguard import HostGuard
from mismatch_ctrl.slime import hooks, tis
from mismatch_ctrl.slime._groups import Topology

CASES: dict[str, dict[str, Any]] = {
    "metrics_only": method("grpo"),
    "icepop": method("icepop"),
    "geo_rs_token_tis": method("grpo", name="geo_rs_token_tis", correction={"preset": "geo_rs_token_tis"}),
    "seq_tis_normalized": method("grpo", name="seq_tis_normalized",
                                 correction={"preset": "seq_tis", "batch_normalize": True}),
    "k3_rs_clip": method("grpo", name="k3_rs_clip", correction={"preset": "k3_rs", "is_level": "token",
                                                                  "is_mode": "clip", "is_high": 1.5}),
}
"""Every kind of correction stage once: none (the metrics alone), token-level mask (IcePop), geometric band with veto
and token truncation, sequence-level weights with batch normalisation, K3 rejection with token clipping."""
GEO_RS_TOKEN_TIS = CASES["geo_rs_token_tis"]
WORLD_TIMEOUT_S = 240


@pytest.fixture(autouse=True)
def fresh_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts without compiled graphs or recorded failures, with the fast test backend."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    monkeypatch.setattr(compiled, "_failed", set())
    monkeypatch.setattr(compiled, "_under_modes", set())
    yield
    torch._dynamo.reset()


def graphs() -> int:
    """Graphs compiled in this process since the last reset."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def with_compile(section: dict[str, Any]) -> dict[str, Any]:
    return {**section, "torch_compile": True}


def tis_inputs(batch_seed: int, samples: int, tokens: int | None = None) -> dict[str, Any]:
    """The TIS hook's keyword arguments for ``samples`` responses of a random batch (``tokens``: about that many in
    all), ``pg_loss`` a function of the log-probs."""
    batch = make_batch(seed=batch_seed, groups=max(2, -(-samples // 4)),
                       mean_length=24.0 if tokens is None else max(tokens / samples, 1.0))
    pick = list(range(samples))
    train = [batch.train[i] for i in pick]
    return {"pg_loss": torch.cat(train).neg() * 0.5 + 0.1, "train_log_probs": train,
            "rollout_log_probs": [batch.rollout[i] for i in pick], "loss_masks": [batch.loss_masks[i] for i in pick],
            "total_lengths": [batch.total_lengths[i] for i in pick],
            "response_lengths": [batch.response_lengths[i] for i in pick]}


def tis_call(args: Any, inputs: dict[str, Any]) -> tuple[Any, torch.Tensor]:
    """One TIS-hook call with a fresh ``pg_loss`` leaf (and fresh masks), backpropagated; the hook's outputs and the
    gradient."""
    leaf = inputs["pg_loss"].detach().clone().requires_grad_(True)
    out = hooks.rollout_correction(args, **{**inputs, "pg_loss": leaf,
                                            "loss_masks": [m.clone() for m in inputs["loss_masks"]]})
    out[0].nan_to_num(0.0).sum().backward()
    return out, leaf.grad


def call_both(inputs: dict[str, Any], section: dict[str, Any] = GEO_RS_TOKEN_TIS
              ) -> tuple[tuple[Any, torch.Tensor], tuple[Any, torch.Tensor]]:
    """The compiled and the eager hook (fresh runtimes) on the same inputs."""
    return tis_call(make_args(with_compile(section)), inputs), tis_call(make_args(section), inputs)


def assert_calls_equal(got: tuple[Any, torch.Tensor], expected: tuple[Any, torch.Tensor], where: str,
                       tolerance: float = 0.0) -> None:
    (loss, masks, metrics), grad = got
    (loss_e, masks_e, metrics_e), grad_e = expected
    assert_same({"pg_loss": loss.detach(), "grad": grad, "masks": masks, "metrics": metrics},
                {"pg_loss": loss_e.detach(), "grad": grad_e, "masks": masks_e, "metrics": metrics_e}, where, tolerance)
    assert loss.requires_grad and loss.dtype == loss_e.dtype, where


@pytest.mark.parametrize("case", CASES)
def test_the_compiled_hook_gives_the_eager_hooks_results(case):
    """Three rollouts of both hooks, each TIS call on two micro-batches: every output of the compiled TIS hook (and
    the advantage hook's, which is not compiled) equals the eager hook's exactly, and the graphs did run."""
    eager = run_hooks(CASES[case], "cpu", 4, Syncs())
    got = run_hooks(with_compile(CASES[case]), "cpu", 4, Syncs())
    assert graphs() >= 1 and not compiled._failed
    assert_same(got, eager, case)


def test_a_few_graphs_serve_micro_batches_of_every_size():
    """Micro-batches of 1 to 64 responses and 5 to 30k tokens, chosen to meet the size classes the compiler tells
    apart (one response, fewer than two whole blocks in all or in the responses, a token count a multiple of the
    block): the compiled hook equals the eager one on each, with one graph per class (at most 12 for these 20
    sizes); the same sizes with other values, and new sizes of long responses, compile no more."""
    rng = random.Random(53)
    sizes = [(8, 2048), (1, 100), (1, 5000), (2, 128), (3, 256), (64, 20000), (9, 777), (2, 50), (5, 5), (48, 3000),
             (40, 6000), (1, 256)] + [(rng.randint(1, 64), rng.randint(64, 30000)) for _ in range(8)]
    inputs = [tis_inputs(300 + k, samples, tokens) for k, (samples, tokens) in enumerate(sizes)]
    for one, (samples, tokens) in zip(inputs, sizes):
        assert_calls_equal(*call_both(one), f"{samples} responses, ~{tokens} tokens")
    first = graphs()
    assert 1 <= first <= 12 and not compiled._failed
    for one in inputs:
        call_both({**one, "pg_loss": one["pg_loss"] * 3.0 - 1.0,
                   "rollout_log_probs": [t * 0.5 for t in one["rollout_log_probs"]]})
    for k in range(4):
        samples = rng.randint(2, 16)
        assert_calls_equal(*call_both(tis_inputs(400 + k, samples, samples * rng.randint(600, 2000))),
                           f"long responses: {samples}")
    assert graphs() == first


@pytest.fixture
def one_process_group(tmp_path) -> Iterator[Any]:
    """A gloo process group of this process alone (the functional collectives need a real group)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_the_graph_holds_its_gathers_and_no_host_transfer(one_process_group, monkeypatch):
    """With both gathers over a real group (context- and data-parallel), the compiled call records one functional
    all-gather for each in its one graph, no ``torch.distributed`` call runs, no op reads a value to the host, the
    results equal the eager hook's with the same groups, and the next call reuses the graph."""
    reducers = Reducers(seq=GroupGather(lambda: one_process_group, "context_parallel"),
                        batch=GroupGather(lambda: one_process_group, "data_parallel"))
    monkeypatch.setattr(tis, "topology", lambda: Topology(cp_size=1, reducers=reducers))
    recorded: list[torch.fx.GraphModule] = []

    def recording_backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        recorded.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, inputs)

    monkeypatch.setattr(compiled, "BACKEND", recording_backend)
    eager_calls: list[Any] = []
    monkeypatch.setattr(dist, "all_gather_into_tensor", spy(dist.all_gather_into_tensor, eager_calls))
    inputs = tis_inputs(7, 12, 3000)
    got = tis_call(make_args(with_compile(GEO_RS_TOKEN_TIS)), inputs)
    assert not eager_calls, "a torch.distributed collective ran in the compiled call"
    expected = tis_call(make_args(GEO_RS_TOKEN_TIS), inputs)
    assert len(eager_calls) == 2  # the eager hook: one gather over CP, one over DP
    assert_calls_equal(got, expected, "one-process group")
    assert len(recorded) == 1
    tis_call(make_args(with_compile(GEO_RS_TOKEN_TIS)), tis_inputs(8, 12, 3000))
    assert len(recorded) == 1, "a second call (new gathers over the same groups) compiled again"
    targets = [str(node.target) for node in recorded[0].graph.nodes if node.op in ("call_function", "call_method")]
    assert sum("all_gather_into_tensor" in t for t in targets) == 2, targets
    assert not [t for t in targets if t in ("item", "tolist", "cpu", "numpy") or "local_scalar" in t], targets


class WrappedGroup(dist.ProcessGroup):
    """A stand-in for slime's ``ReloadableProcessGroup`` (624b824a ``slime/utils/reloadable_process_group.py:285``),
    written from its contract: a Python ``ProcessGroup`` of the real group's rank and size that keeps the real group
    in ``.group`` (replaced by a new one when slime re-creates the groups around offload) and forwards to it; slime
    also patches ``torch.distributed``'s query and collective functions to pass ``.group`` on (``:158-190``)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__(group.rank(), group.size())
        self.group = group

    def __getattr__(self, name: str) -> Any:
        return getattr(self.group, name)


def unwrapping(fn: Any) -> Any:
    """``fn`` with :class:`WrappedGroup` arguments replaced by their group, as slime's patch does."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a.group if isinstance(a, WrappedGroup) else a for a in args)
        return fn(*args, **{k: v.group if isinstance(v, WrappedGroup) else v for k, v in kwargs.items()})
    return wrapper


def test_slimes_wrapped_and_re_created_groups_reuse_the_graph(one_process_group, monkeypatch):
    """Over groups wrapped as slime wraps them, re-created between calls as slime re-creates them every rollout: the
    compiled hook gives the eager hook's results and compiles once (its gathers reach the current group, the one
    inside the wrapper, under a fixed name)."""
    for name in ("get_backend", "get_world_size", "all_gather_into_tensor"):
        monkeypatch.setattr(dist, name, unwrapping(getattr(dist, name)))
    cp, dp = WrappedGroup(dist.new_group([0])), WrappedGroup(dist.new_group([0]))
    reducers = Reducers(seq=GroupGather(lambda: cp, "context_parallel"), batch=GroupGather(lambda: dp, "data_parallel"))
    monkeypatch.setattr(tis, "topology", lambda: Topology(cp_size=1, reducers=reducers))
    for k in range(3):
        assert_calls_equal(*call_both(tis_inputs(70 + k, 12, 3000)), f"call {k}")
        for alias, wrapped in (("mismatch_ctrl.context_parallel", cp), ("mismatch_ctrl.data_parallel", dp)):
            assert torch._C._distributed_c10d._resolve_process_group(alias).group_name == wrapped.group.group_name
        cp.group, dp.group = dist.new_group([0]), dist.new_group([0])  # slime's reload: new groups, new names
    assert graphs() == 1 and not compiled._failed


def spy(fn: Any, calls: list[Any]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return fn(*args, **kwargs)
    return wrapper


def test_the_rare_paths_run_compiled_too(monkeypatch):
    """Dropped tokens (NaN / -inf log-probs), a NaN pg_loss at an untrained token, and a log-prob above 0 by rounding
    run compiled as well (so every rank makes the same collectives), with the eager hook's results."""
    calls: list[Any] = []
    monkeypatch.setattr(tis, "_compiled_correction", spy(tis._compiled_correction, calls))
    batch = make_batch(seed=11, groups=2, nonfinite=True)
    dropped = {**tis_inputs(11, 8), "train_log_probs": batch.train[:8], "rollout_log_probs": batch.rollout[:8]}
    assert any(batch.nonfinite[:8])
    clean = tis_inputs(11, 8)
    untrained = torch.cat(clean["loss_masks"]) == 0
    first_untrained = untrained & (torch.cumsum(untrained, 0) == 1)
    nan_untrained = {**clean, "pg_loss": clean["pg_loss"].masked_fill(first_untrained, float("nan"))}
    rounding = {**clean, "train_log_probs": [t.clone() for t in clean["train_log_probs"]]}
    rounding["train_log_probs"][0][0] = 4e-4
    for label, inputs in (("dropped tokens", dropped), ("NaN pg_loss at an untrained token", nan_untrained),
                          ("rounding", rounding)):
        before = len(calls)
        got, expected = call_both(inputs)
        assert len(calls) == before + 1, label
        assert_calls_equal(got, expected, label)
    assert not compiled._failed


def test_an_error_of_the_graphs_run_is_raised_and_one_before_it_falls_back(monkeypatch):
    """An exception once the graph runs (the kernels', the inputs') is raised, not hidden by the eager code; one
    raised before it runs, even one dynamo does not wrap (an internal ``AssertionError`` while building guards),
    is a failed compile: one warning, the eager hook's results."""
    def failing_run(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        def run(*args: Any) -> Any:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return run

    monkeypatch.setattr(compiled, "BACKEND", failing_run)
    inputs = tis_inputs(15, 8)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        tis_call(make_args(with_compile(GEO_RS_TOKEN_TIS)), inputs)
    assert not compiled._failed
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")

    def broken_guards(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("internal: guard on a freed tensor")

    monkeypatch.setattr(torch._dynamo.guards.CheckFunctionManager, "__init__", broken_guards)
    got, expected = call_both(inputs)
    assert_calls_equal(got, expected, "after a raw AssertionError")
    assert compiled._failed


def test_a_failing_compiler_warns_once_and_the_hook_runs_eager(monkeypatch, caplog):
    """A backend that raises (as where no C++ compiler or Triton is found): one warning naming the function and the
    way out, the eager hook's results, and no second attempt."""
    attempts = []

    def broken_backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        attempts.append(gm)
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(compiled, "BACKEND", broken_backend)
    args = make_args(with_compile(GEO_RS_TOKEN_TIS))
    inputs = [tis_inputs(5, 8), tis_inputs(6, 8)]
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        first, second = (tis_call(args, one) for one in inputs)
    warnings = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
    assert len(warnings) == 1 and "_compiled_correction" in warnings[0] and "torch_compile: false" in warnings[0]
    assert "no C++ compiler found" in warnings[0]
    assert len(attempts) == 1
    assert_calls_equal(first, tis_call(make_args(GEO_RS_TOKEN_TIS), inputs[0]), "first call")
    assert_calls_equal(second, tis_call(make_args(GEO_RS_TOKEN_TIS), inputs[1]), "second call")


def test_past_the_recompile_limit_the_hook_runs_eager(monkeypatch, caplog):
    """A class of sizes beyond the graphs the limit allows (here 1): one warning, the eager hook's results, and no
    further compiling."""
    assert compiled.SETTINGS[-1][1] == "recompile_limit"
    monkeypatch.setattr(compiled, "SETTINGS", (*compiled.SETTINGS[:-1], ("torch._dynamo.config", "recompile_limit", 1)))
    inputs = [tis_inputs(12, 8, 2000), tis_inputs(13, 1, 100), tis_inputs(14, 3, 50)]
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        for k, one in enumerate(inputs):
            assert_calls_equal(*call_both(one), f"call {k}")
    assert graphs() == 1 and compiled._failed
    assert len([r for r in caplog.records if "torch.compile of" in r.getMessage()]) == 1


def test_under_an_op_intercepting_mode_the_hook_runs_eager_with_its_one_sync(caplog):
    """HostGuard (a torch function mode, as an op counter is) cannot run inside a compiled graph: the hook runs eager
    there, says so once, makes its one host synchronisation, and compiles nothing."""
    inputs, args = tis_inputs(9, 8), make_args(with_compile(GEO_RS_TOKEN_TIS))
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"), HostGuard() as guard:
        got = tis_call(args, inputs)
        tis_call(args, inputs)
    assert guard.syncs == 2 and graphs() == 0 and not compiled._failed
    assert len([r for r in caplog.records if "mode is active" in r.getMessage()]) == 1
    assert_calls_equal(got, tis_call(make_args(GEO_RS_TOKEN_TIS), inputs), "under HostGuard")


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="inductor needs a C++ compiler on a CPU (the hook would warn and run eager)")
def test_inductor_compiles_the_hook_within_float32_rounding(monkeypatch):
    """The production backend (C++ kernels on the CPU, Triton on a GPU) fuses the columns into a few kernels whose
    sums run in another order: the results agree with the eager hook's within float32 rounding."""
    monkeypatch.setattr(compiled, "BACKEND", "inductor")
    got, expected = call_both(tis_inputs(21, 16, 3000))
    assert graphs() >= 1 and not compiled._failed, "inductor did not compile the hook (is a C++ compiler missing?)"
    assert_calls_equal(got, expected, "inductor", tolerance=1e-5)


@CUDA
@pytest.mark.cuda
def test_on_cuda_the_compiled_hook_equals_the_cpu_with_one_sync(monkeypatch):
    """Inductor's Triton kernels on the GPU: the compiled hook gives the eager CPU hook's results within float32
    rounding, with the one host synchronisation of the input check (the CUDA runtime's count, after the compiling
    call), for 8 and for 40 responses."""
    monkeypatch.setattr(compiled, "BACKEND", "inductor")
    for samples in (8, 40):
        inputs = tis_inputs(31 + samples, samples, samples * 900)
        on_gpu = moved(inputs, "cuda")
        args = make_args(with_compile(GEO_RS_TOKEN_TIS))
        tis_call(args, on_gpu)
        with CudaSyncs()() as counted:
            hooks.rollout_correction(args, **on_gpu)
        assert counted.syncs == 1, counted.sites
        got = tis_call(args, on_gpu)
        assert not compiled._failed
        assert_calls_equal(moved(got, "cpu"), tis_call(make_args(GEO_RS_TOKEN_TIS), inputs), f"{samples} on CUDA",
                           tolerance=1e-5)


def test_torch_compile_is_a_boolean_and_refuses_acrl():
    from mismatch_ctrl.config import build_config

    assert build_config({"name": "x", "torch_compile": True}, architecture="moe").torch_compile
    assert not build_config({"name": "x"}, architecture="moe").torch_compile
    with pytest.raises(ConfigError, match="torch_compile"):
        build_config({"name": "x", "torch_compile": "yes"}, architecture="moe")
    with pytest.raises(ConfigError, match="torch_compile.*ACRL"):
        build_config({"name": "x", "torch_compile": True, "acrl": {"enabled": True}}, architecture="moe")


def test_a_torch_without_what_the_compiled_hook_uses_is_refused(monkeypatch):
    from mismatch_ctrl.config import build_config

    assert compiled.missing_support() == []
    monkeypatch.setattr(compiled, "NEEDED", (*compiled.NEEDED, "torch._dynamo.config.no_such_setting"))
    with pytest.raises(ConfigError, match=r"torch_compile: this torch .* lacks torch._dynamo.config.no_such_setting"):
        build_config({"name": "x", "torch_compile": True}, architecture="moe")
    assert not build_config({"name": "x"}, architecture="moe").torch_compile


def world_rank(rank: int, layout: str, store: str, out: str) -> None:
    """One rank of a world of two over gloo with megatron's process groups (``layout``: ``dp`` for data-parallel 2,
    ``cp`` for context-parallel 2): the hooks on this rank's share of a rollout, each TIS call compiled and eager,
    with the ``torch.distributed`` collectives each made; saved to ``out/r<rank>.pt``."""
    from megatron.core import parallel_state

    torch.set_num_threads(1)
    compiled.BACKEND = "aot_eager"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    parallel_state.initialize_model_parallel(context_parallel_size=2 if layout == "cp" else 1)
    view = View(dp_rank=rank, dp_size=2) if layout == "dp" else View(cp_rank=rank, cp_size=2)
    collectives: list[Any] = []
    dist.all_gather_into_tensor = spy(dist.all_gather_into_tensor, collectives)
    data = rollout_data(make_batch(seed=61, groups=4), view)
    results = []
    for samples in micro_batches(list(range(len(data["rewards"])))):
        inputs = {"pg_loss": torch.cat([data["log_probs"][i] for i in samples]).neg(),
                  **{key: [data[name][i] for i in samples] for key, name in (
                      ("train_log_probs", "log_probs"), ("rollout_log_probs", "rollout_log_probs"),
                      ("loss_masks", "loss_masks"), ("total_lengths", "total_lengths"),
                      ("response_lengths", "response_lengths"))}}
        calls = {}
        for label, section in (("compiled", with_compile(GEO_RS_TOKEN_TIS)), ("eager", GEO_RS_TOKEN_TIS)):
            before = len(collectives)
            (loss, masks, metrics), grad = tis_call(make_args(section), inputs)
            calls[label] = {"pg_loss": loss.detach(), "grad": grad, "masks": masks, "metrics": metrics,
                            "collectives": len(collectives) - before}
        results.append(calls)
    torch.save({"results": results, "graphs": graphs(), "failed": sorted(compiled._failed)}, f"{out}/r{rank}.pt")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.parametrize("layout", ["dp", "cp"])
def test_on_two_ranks_the_compiled_gathers_equal_torch_distributed(layout, tmp_path):
    """Data-parallel 2 and context-parallel 2 with megatron's process groups over gloo: on every rank and micro-batch
    the compiled hook (its gather a functional collective in the graph, no ``torch.distributed`` call) gives the
    eager hook's results (one ``all_gather_into_tensor``), bit for bit."""
    import torch.multiprocessing as mp

    context = mp.start_processes(world_rank, args=(layout, str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                                 start_method="spawn", join=False)
    deadline = time.monotonic() + WORLD_TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the two ranks ({layout}) did not finish within {WORLD_TIMEOUT_S} s (a collective mismatch?)")
    for rank in range(2):
        saved = torch.load(tmp_path / f"r{rank}.pt", weights_only=False)
        assert saved["graphs"] >= 1 and not saved["failed"], rank
        for k, calls in enumerate(saved["results"]):
            where = f"{layout} rank {rank} micro-batch {k}"
            assert calls["compiled"].pop("collectives") == 0 and calls["eager"].pop("collectives") == 1, where
            assert_same(calls["compiled"], calls["eager"], where)
