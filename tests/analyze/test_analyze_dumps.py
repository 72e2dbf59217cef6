"""slime's dump format: the writer produces it exactly; the reader takes it (and its variants) one rollout at a time
and reports unusable files by name instead of crashing."""

from pathlib import Path

import pytest
import torch

from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.analyze.dumps import (
    DumpError,
    Skipped,
    find_rollouts,
    iter_rollouts,
    load_dump,
    read_rollout,
    samples_from_rollout_data,
    write_rollout_dump,
    write_train_dump,
)
from mismatch_ctrl.errors import InputError

from .synthetic import make_rollout, write_run

SLIME_SAMPLE_FIELDS = {
    # slime/utils/types.py Sample at 624b824, plus the three nested/enum fields Sample.to_dict() rewrites
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
    "multimodal_train_input_id", "apply_chat_template_kwargs", "response", "response_length", "label", "reward",
    "loss_mask", "weight_versions", "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata", "generate_function_path",
    "custom_rm_path", "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info",
}


def slime_rollout_data():
    """One DP rank's rollout_data as slime's advantage hook sees it (CP = 1), like slime's own dump tests."""
    return {
        "tokens": [torch.tensor([10, 11, 12, 13]), torch.tensor([20, 21, 22, 23, 24])],
        "total_lengths": [4, 5],
        "response_lengths": [2, 3],
        "partition": [5, 2],
        "sample_indices": [51, 21],
        "loss_masks": [torch.tensor([1, 1], dtype=torch.int), torch.tensor([1, 0, 1], dtype=torch.int)],
        "log_probs": [torch.tensor([-0.1, -0.2]), torch.tensor([-0.3, -0.4, -0.5])],
        "rollout_log_probs": [torch.tensor([-0.1, -0.25]), torch.tensor([-0.3, -0.4, -0.6])],
        "advantages": [torch.tensor([0.5, 0.5]), torch.tensor([-0.5, -0.5, -0.5])],
        "rewards": [1.0, -1.0],
        "truncated": [0, 1],
        "rollout_mask_sums": torch.tensor([2.0, 2.0]),
        "raw_reward": [0.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        "micro_batch_indices": [[0, 1]],
        "num_microbatches": [1],
        "global_batch_sizes": [2],
    }


def test_train_dump_from_rollout_data_has_slimes_layout(tmp_path):
    data = slime_rollout_data()
    path = write_train_dump(tmp_path, 9, *samples_from_rollout_data(data), rank=3)
    assert path == tmp_path / "train_data" / "9.pt"
    saved = torch.load(path, weights_only=True)  # slime's e2e test loads train dumps with weights_only=True
    assert set(saved) == {"format_version", "rollout_id", "rank", "samples", "dp_shards", "raw_reward"}
    assert (saved["format_version"], saved["rollout_id"], saved["rank"]) == (2, 9, 3)
    assert saved["raw_reward"] == data["raw_reward"]
    # samples sorted by rollout_position (the partition), ids surfaced as scalars
    assert [s["rollout_position"] for s in saved["samples"]] == [2, 5]
    assert [s["sample_index"] for s in saved["samples"]] == [21, 51]
    assert [s["data_parallel_rank"] for s in saved["samples"]] == [0, 0]
    first = saved["samples"][0]
    assert first["response_lengths"] == 3 and first["total_lengths"] == 5 and first["truncated"] == 1
    assert first["rewards"] == -1.0
    assert first["log_probs"].dtype == torch.float32
    assert first["log_probs"].tolist() == pytest.approx([-0.3, -0.4, -0.5])
    assert first["loss_masks"].dtype == torch.int32 and first["loss_masks"].tolist() == [1, 0, 1]
    assert first["tokens"].dtype == torch.long and first["tokens"].tolist() == [20, 21, 22, 23, 24]
    assert first["rollout_mask_sums"].dim() == 0
    for layout_key in ("micro_batch_indices", "num_microbatches", "global_batch_sizes", "partition",
                       "sample_indices", "raw_reward"):
        assert layout_key not in first
    assert saved["dp_shards"] == [{"rank": 3, "data_parallel_rank": 0, "sample_indices": [51, 21],
                                   "partition": [5, 2], "micro_batch_indices": [[0, 1]], "num_microbatches": [1],
                                   "global_batch_sizes": [2]}]


def test_train_dump_merges_data_parallel_shards_in_rollout_order(tmp_path):
    rows = [{"response_lengths": 1, "rollout_position": p, "sample_index": p, "data_parallel_rank": dp,
             "log_probs": torch.tensor([float(p)])} for dp, p in ((0, 2), (0, 0), (1, 3), (1, 1))]
    saved = torch.load(write_train_dump(tmp_path, 5, rows), weights_only=True)
    assert [s["log_probs"].item() for s in saved["samples"]] == [0.0, 1.0, 2.0, 3.0]
    assert [s["data_parallel_rank"] for s in saved["samples"]] == [0, 1, 0, 1]
    assert [(s["rank"], s["data_parallel_rank"], s["sample_indices"], s["partition"]) for s in saved["dp_shards"]] == \
        [(0, 0, [2, 0], [2, 0]), (1, 1, [3, 1], [3, 1])]


def test_train_dump_rejects_what_slime_never_writes(tmp_path):
    with pytest.raises(InputError, match=r"sample 0: log_probs has 2 tokens but response_lengths is 3"):
        write_train_dump(tmp_path, 0, [{"response_lengths": 3, "log_probs": torch.zeros(2)}])
    with pytest.raises(InputError, match="reserved"):
        write_train_dump(tmp_path, 0, [{"response_lengths": 0}], {"samples": []})
    with pytest.raises(InputError, match="response_lengths"):
        write_train_dump(tmp_path, 0, [{"log_probs": torch.zeros(2)}])
    assert not (tmp_path / "train_data" / "0.pt").exists()


def test_rollout_dump_holds_complete_sample_dicts(tmp_path):
    path = write_rollout_dump(tmp_path, 4, [
        {"response_length": 2, "rollout_log_probs": torch.tensor([-0.5, -1.0]), "status": "truncated", "reward": 1.0},
        {"response_length": 1, "loss_mask": [1]},
    ])
    assert path == tmp_path / "rollout_data" / "4.pt"
    saved = torch.load(path, weights_only=False)
    assert set(saved) == {"rollout_id", "samples"} and saved["rollout_id"] == 4
    first, second = saved["samples"]
    assert set(first) == SLIME_SAMPLE_FIELDS and set(second) == SLIME_SAMPLE_FIELDS
    assert first["rollout_log_probs"] == [-0.5, -1.0] and first["status"] == "truncated" and first["reward"] == 1.0
    assert second["status"] == "pending" and second["rollout_log_probs"] is None and second["loss_mask"] == [1]
    assert first["metadata"] is not second["metadata"]
    with pytest.raises(InputError, match="status"):
        write_rollout_dump(tmp_path, 5, [{"response_length": 0, "status": "done"}])
    with pytest.raises(InputError, match="rollout_log_probs has 1 entries but response_length is 2"):
        write_rollout_dump(tmp_path, 5, [{"response_length": 2, "rollout_log_probs": [0.0]}])


def test_reader_returns_the_written_columns(tmp_path):
    g = torch.Generator().manual_seed(1)
    truth = make_rollout(3, g)
    write_run(tmp_path, [truth])
    (groups, skipped) = find_rollouts(tmp_path)
    assert skipped == [] and [(f.rollout_id, f.train.name, f.rollout.name) for f in groups] == [(3, "3.pt", "3.pt")]
    dump = read_rollout(groups[0])
    assert dump.rollout_id == 3 and dump.response_lengths == truth.lengths
    assert dump.files == [str(tmp_path / "train_data" / "3.pt")]  # the rollout dump is not needed
    for got, want in ((dump.train_log_probs, truth.train), (dump.rollout_log_probs, truth.rollout),
                      (dump.loss_masks, truth.masks)):
        assert all(torch.equal(a, b.float()) for a, b in zip(got, want))
    assert dump.truncated == [bool(t) for t in truth.truncated]
    assert dump.rewards == pytest.approx(truth.rewards) and dump.raw_rewards == truth.raw


def test_missing_columns_come_from_the_rollout_dump_or_stay_missing(tmp_path):
    g = torch.Generator().manual_seed(2)
    a, b, c = (make_rollout(i, g) for i in range(3))
    a.omit = {"rollout_log_probs", "truncated"}
    b.omit = {"log_probs", "loss_masks", "rewards"}
    write_run(tmp_path, [a, b, c], train_dumps={0, 1})
    dumps = list(iter_rollouts(tmp_path))
    filled, no_train, rollout_only = dumps
    assert filled.files == [str(tmp_path / "train_data" / "0.pt"), str(tmp_path / "rollout_data" / "0.pt")]
    assert all(torch.equal(x, y) for x, y in zip(filled.rollout_log_probs, a.rollout))
    assert filled.truncated == [bool(t) for t in a.truncated]
    assert no_train.train_log_probs is None and no_train.rewards is None
    assert [m.tolist() for m in no_train.loss_masks] == [[1.0] * n for n in b.lengths]
    assert rollout_only.train_log_probs is None and rollout_only.raw_rewards == c.raw
    assert rollout_only.truncated == [bool(t) for t in c.truncated]
    assert [m.tolist() for m in rollout_only.loss_masks] == [m.tolist() for m in c.masks]


def test_unusable_files_are_reported_by_name_and_skipped(tmp_path):
    g = torch.Generator().manual_seed(3)
    write_run(tmp_path, [make_rollout(i, g) for i in range(6)], rollout_dumps=False)
    train = tmp_path / "train_data"
    whole = (train / "1.pt").read_bytes()
    (train / "1.pt").write_bytes(whole[: len(whole) // 2])  # truncated by a crash or a full disk
    (train / "2.pt").write_text("not a torch file")
    torch.save([1, 2, 3], train / "3.pt")  # foreign content
    payload = torch.load(train / "4.pt", weights_only=True)
    torch.save({**payload, "format_version": 3}, train / "4.pt")
    cp_local = torch.load(train / "5.pt", weights_only=True)  # as if written before the CP gather
    sample = cp_local["samples"][2]
    sample["log_probs"] = sample["log_probs"][: sample["response_lengths"] // 2]
    torch.save(cp_local, train / "5.pt")
    torch.save({"rollout_id": 0, "rank": 3, "rollout_data": {"tokens": [[1, 2]]}}, train / "0_3.pt")  # format 1
    torch.save(payload, train / "eval_0.pt")
    results = list(iter_rollouts(tmp_path))
    reasons = {r.path: r.reason for r in results if not hasattr(r, "response_lengths")}
    assert [r.rollout_id for r in results if hasattr(r, "response_lengths")] == [0]
    assert set(reasons) == {str(train / f"{name}.pt") for name in ("0_3", "1", "2", "3", "4", "5")}
    assert "cannot be read as a torch dump" in reasons[str(train / "1.pt")]
    assert "cannot be read as a torch dump" in reasons[str(train / "2.pt")]
    assert "not a slime debug dump" in reasons[str(train / "3.pt")]
    assert "format_version 3" in reasons[str(train / "4.pt")]
    assert "sample 2" in reasons[str(train / "5.pt")]
    assert "context-parallel shards gathered" in reasons[str(train / "5.pt")]
    assert "before 681b3ad" in reasons[str(train / "0_3.pt")]


def test_a_flat_directory_of_dumps_is_read_by_content(tmp_path):
    g = torch.Generator().manual_seed(4)
    truth = [make_rollout(i, g) for i in range(2)]
    write_run(tmp_path / "run", truth)
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "train_1_0.pt").write_bytes((tmp_path / "run" / "train_data" / "1.pt").read_bytes())
    (flat / "rollout_0.pt").write_bytes((tmp_path / "run" / "rollout_data" / "0.pt").read_bytes())
    dumps = list(iter_rollouts(flat))
    assert [d.rollout_id for d in dumps] == [0, 1]
    assert dumps[0].train_log_probs is None and dumps[1].train_log_probs is not None
    assert dumps[1].response_lengths == truth[1].lengths


def test_a_rollout_dump_in_train_data_is_an_error_not_a_crash(tmp_path):
    write_rollout_dump(tmp_path, 0, [{"response_length": 1}])
    (tmp_path / "train_data").mkdir()
    (tmp_path / "rollout_data" / "0.pt").rename(tmp_path / "train_data" / "0.pt")
    with pytest.raises(DumpError, match="a rollout dump in train_data/"):
        read_rollout(find_rollouts(tmp_path)[0][0])


def copy_dump(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())


@pytest.mark.parametrize("template", [
    "qwen3_30b_a3b_{rollout_id}.pt",  # digits before the id
    "run7/{rollout_id}_{rank}.pt",  # slime's {rank} placeholder: the writer's rank, a constant
    "train_data/{rollout_id}_{rank}.pt",
    "v2_{rank}_{rollout_id}.pt",
])
def test_own_path_templates_give_the_rollout_id_that_varies(tmp_path, template):
    """--save-debug-train-data accepts any template with {rollout_id} (and {rank}, slime arguments.py:1280-1288)."""
    g = torch.Generator().manual_seed(5)
    truth = [make_rollout(i, g) for i in (0, 1, 2, 5, 12)]
    write_run(tmp_path / "run", truth, rollout_dumps=False)
    out = tmp_path / "out"
    for r in truth:
        name = template.format(rollout_id=r.rollout_id, rank=3)
        copy_dump(tmp_path / "run" / "train_data" / f"{r.rollout_id}.pt", out / name)
    root = out / template.split("/")[0] if template.startswith("run7") else out
    groups, skipped = find_rollouts(root)
    assert skipped == [] and [f.rollout_id for f in groups] == [0, 1, 2, 5, 12]
    assert [d.response_lengths for d in iter_rollouts(root)] == [r.lengths for r in truth]


def test_a_lone_file_with_several_numbers_takes_the_id_it_stores(tmp_path):
    g = torch.Generator().manual_seed(6)
    write_run(tmp_path / "run", [make_rollout(4, g)], rollout_dumps=False)
    copy_dump(tmp_path / "run" / "train_data" / "4.pt", tmp_path / "flat" / "step_4_rank_0.pt")
    copy_dump(tmp_path / "run" / "train_data" / "4.pt", tmp_path / "other" / "step_9_rank_0.pt")
    assert [d.rollout_id for d in iter_rollouts(tmp_path / "flat")] == [4]
    (skipped,) = iter_rollouts(tmp_path / "other")
    assert "rollout_id stored in the file (4) is none of them" in skipped.reason


@pytest.mark.parametrize("template", ["rollout_{rollout_id}.pt", "{rollout_id}.pt", "dump-{rollout_id}.pt"])
def test_evaluation_dumps_are_left_out_in_any_template(tmp_path, template):
    """slime writes evaluations to the same template with rollout_id 'eval_<id>' (rollout_data_utils.py:144)."""
    for rid in (0, 1):
        write_rollout_dump(tmp_path / "run", rid, [{"response_length": 2, "rollout_log_probs": [-0.1, -0.2]}])
        src = tmp_path / "run" / "rollout_data" / f"{rid}.pt"
        copy_dump(src, tmp_path / "flat" / template.format(rollout_id=rid))
        copy_dump(src, tmp_path / "flat" / template.format(rollout_id=f"eval_{rid}"))
    groups, skipped = find_rollouts(tmp_path / "flat")
    assert skipped == [] and [f.rollout_id for f in groups] == [0, 1]
    assert all(len(f.paths) == 1 and "eval" not in f.paths[0].name for f in groups)


def test_dict_rewards_are_read_with_the_reward_key(tmp_path):
    write_rollout_dump(tmp_path, 0, [{"response_length": 1, "reward": {"score": 1.0, "acc": True}},
                                     {"response_length": 1, "reward": {"score": -1.0, "acc": False}}])
    (dump,) = iter_rollouts(tmp_path, reward_key="score")
    assert dump.raw_rewards == [1.0, -1.0]
    (dump,) = iter_rollouts(tmp_path)
    assert dump.raw_rewards is None and any("--reward-key, one of 'acc', 'score'" in n for n in dump.notes)
    (dump,) = iter_rollouts(tmp_path, reward_key="pred")
    assert dump.raw_rewards is None and any("not every reward has the key 'pred'" in n for n in dump.notes)
    write_rollout_dump(tmp_path, 0, [{"response_length": 1, "reward": {"score": "yes"}}])
    (dump,) = iter_rollouts(tmp_path, reward_key="score")
    assert dump.raw_rewards is None and dump.notes[-1] == f"rewards left out of the replay: {tmp_path}/rollout_data/" \
        "0.pt: sample 0: reward is 'yes', not a number"


class Opaque:
    """Stands for an object a rollout dump may carry (a PIL image in Sample.multimodal_inputs)."""


def test_dates_load_safely_and_other_objects_are_refused_by_name(tmp_path):
    import datetime

    when = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.timezone.utc)
    write_rollout_dump(tmp_path, 0, [{"response_length": 1, "metadata": {"created": when,
                                                                         "age": datetime.timedelta(days=2)}}])
    (dump,) = iter_rollouts(tmp_path)
    assert dump.response_lengths == [1]
    write_rollout_dump(tmp_path, 1, [{"response_length": 1, "multimodal_inputs": {"images": [Opaque()]}}])
    skipped = [r for r in iter_rollouts(tmp_path) if not hasattr(r, "response_lengths")]
    (refused,) = skipped
    assert "Opaque" in refused.reason and "--unsafe-load" in refused.reason and "never" not in refused.reason
    assert [d.rollout_id for d in iter_rollouts(tmp_path, unsafe_load=True)] == [0, 1]


def hostile(tmp_path, change):
    """Rollout 0's train dump with ``change(payload)`` applied, saved as slime would (torch.save)."""
    g = torch.Generator().manual_seed(9)
    write_run(tmp_path, [make_rollout(0, g)], rollout_dumps=False)
    path = tmp_path / "train_data" / "0.pt"
    payload = torch.load(path, weights_only=True)
    change(payload)
    torch.save(payload, path)
    return list(iter_rollouts(tmp_path))


def first_sample(key, value):
    return lambda payload: payload["samples"][0].__setitem__(key, value)


@pytest.mark.parametrize("change, needle", [
    (first_sample("loss_masks", torch.ones(1, dtype=torch.int32).expand(10**8)), "overlapping elements"),
    (lambda p: p.__setitem__("format_version", torch.tensor([2, 2])), "format_version"),
    (first_sample("truncated", torch.tensor([1, 0])), "truncated must be true/false or 0/1"),
    (first_sample("truncated", "False"), "truncated must be true/false or 0/1"),
    (first_sample("response_lengths", 2**63), "response_lengths must be between 0 and"),
    (first_sample("response_lengths", 10**30), "response_lengths must be between 0 and"),
])
def test_crafted_train_dumps_are_refused_by_name_without_a_traceback(tmp_path, change, needle):
    (result,) = hostile(tmp_path, change)
    assert isinstance(result, Skipped) and needle in result.reason and len(result.reason) < 500


@pytest.mark.parametrize("change", [
    lambda p: p.__setitem__("raw_reward", "101"),  # a string is not a list of numbers
    lambda p: p.__setitem__("raw_reward", [10**400] * 8),  # too large for a float
    first_sample("rewards", 10**400),
])
def test_unreadable_rewards_are_left_out_not_misread(tmp_path, change):
    (dump,) = hostile(tmp_path, change)
    assert dump.raw_rewards is None or dump.rewards is None


def test_numpy_integer_ids_and_flags_are_accepted(tmp_path):
    import numpy as np

    def change(payload):
        payload["rollout_id"] = np.int64(0)
        payload["samples"][0]["truncated"] = np.bool_(True)

    (dump,) = hostile(tmp_path, change)
    assert dump.rollout_id == 0 and dump.truncated[0] is True


def test_a_fifo_named_pt_is_skipped_not_waited_on(tmp_path):
    import os

    (tmp_path / "train_data").mkdir()
    os.mkfifo(tmp_path / "train_data" / "0.pt")
    os.mkfifo(tmp_path / "train_data" / "run_1_2.pt")
    groups, skipped = find_rollouts(tmp_path)
    assert groups == [] and {s.reason for s in skipped} == {"not a regular file"}


@pytest.mark.parametrize("layout", ["flat", "subfolders"])
def test_a_refused_rollout_dump_does_not_discard_a_good_train_dump(tmp_path, layout):
    g = torch.Generator().manual_seed(10)
    truth = make_rollout(0, g)
    truth.omit = {"truncated"}  # the rollout dump would fill it
    write_run(tmp_path / "run", [truth])
    torch.save({"rollout_id": 0, "samples": [{"multimodal_inputs": Opaque()}]}, tmp_path / "run" / "rollout_data" /
               "0.pt")
    if layout == "flat":
        copy_dump(tmp_path / "run" / "train_data" / "0.pt", tmp_path / "flat" / "train_0.pt")
        copy_dump(tmp_path / "run" / "rollout_data" / "0.pt", tmp_path / "flat" / "rollout_0.pt")
    (dump,) = iter_rollouts(tmp_path / ("flat" if layout == "flat" else "run"))
    assert dump.response_lengths == truth.lengths and dump.train_log_probs is not None and dump.truncated is None
    assert any(n.startswith("not used: ") and "Opaque" in n for n in dump.notes)


def test_a_train_dump_without_samples_says_so_and_nothing_else(tmp_path):
    """A rollout whose samples were all filtered: one note that says it, not 'no loss_masks' and 'no log_probs'."""
    g = torch.Generator().manual_seed(1)
    write_run(tmp_path, [make_rollout(i, g, samples=4) for i in range(3)])
    for kind in ("train_data", "rollout_data"):
        path = tmp_path / kind / "1.pt"
        payload = torch.load(path, weights_only=True)
        payload["samples"] = []
        torch.save(payload, path)
    result = analyze_dumps(tmp_path, AnalyzeOptions(progress=False, architecture="moe"))
    assert result["rollouts"][1]["notes"] == ["train dump without samples: nothing to measure in this rollout"]
    assert result["counts"]["measured"] == 2


NUMPY1_DUMP = Path(__file__).parent / "data" / "numpy1_26_dump.pt"
"""Written by torch.save under numpy 1.26.4 (slime's image) of ``{"rollout_id": 0, "samples": [{"a":
np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.float64(0.5), "i": np.int32(3), "e": np.zeros(0), "f":
np.asfortranarray(np.ones((2, 2))), "b": b""}]}``: its numpy objects pickle under ``numpy.core.multiarray``."""


@pytest.mark.parametrize("numpy_major", ["2", "1"])
def test_a_dump_written_under_numpy_1_loads_safely(monkeypatch, numpy_major):
    """The safe loader allows numpy's functions under both module paths, and picks numpy 1's when it runs there."""
    import warnings

    import numpy as np
    if numpy_major == "1" and np.__version__.startswith("2"):
        monkeypatch.setattr(np, "__version__", "1.26.4")  # the numpy 1 branch; numpy 2 serves numpy.core on request
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sample = load_dump(NUMPY1_DUMP)["samples"][0]
    assert np.array_equal(sample["a"], np.arange(6, dtype=np.float32).reshape(2, 3)) and sample["a"].dtype == np.float32
    assert sample["s"] == 0.5 and sample["i"] == 3 and sample["i"].dtype == np.int32
    assert sample["e"].shape == (0,) and sample["f"].flags.f_contiguous and sample["b"] == b""
