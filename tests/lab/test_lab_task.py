import pytest
import torch

from mismatch_ctrl.lab.model.task import (
    BOS,
    DIGIT0,
    EOS,
    EQUALS,
    PAD,
    AdditionTask,
    ReverseTask,
    cut_after_eos,
    detokenize,
    make_task,
)


def tokens(text: str) -> list[int]:
    """Digits and 'E' (EOS) to token ids."""
    return [EOS if c == "E" else DIGIT0 + int(c) for c in text]


def test_addition_prompt_and_answer_by_hand():
    task = AdditionTask()
    prompts = task.encode(torch.tensor([12, 9999, 0, 5]), torch.tensor([345, 1, 0, 7]))
    assert detokenize(prompts[0]) == "<bos>0012+0345="
    assert prompts.shape == (4, 11)
    answers = [detokenize(row) for row in task.answers(prompts)]
    assert answers == [
        "753<eos><pad><pad>",
        "00001<eos>",
        "0<eos><pad><pad><pad><pad>",
        "21<eos><pad><pad><pad>",
    ]


def test_addition_answers_match_python_string_reversal():
    task = AdditionTask(max_digits=4)
    prompts = task.make_prompts(300, torch.Generator().manual_seed(5))
    a, b = task.operands(prompts)
    answers = task.answers(prompts)
    for row, x, y in zip(answers, a.tolist(), b.tolist()):
        expected = [DIGIT0 + int(c) for c in str(x + y)[::-1]] + [EOS]
        assert row[: len(expected)].tolist() == expected
        assert (row[len(expected) :] == PAD).all()


def test_addition_operands_cover_one_to_four_digits():
    task = AdditionTask()
    a, b = task.operands(task.make_prompts(2000, torch.Generator().manual_seed(0)))
    values = torch.cat([a, b])
    n_digits = 1 + (values >= 10).long() + (values >= 100).long() + (values >= 1000).long()
    counts = torch.bincount(n_digits, minlength=5)[1:]
    assert (counts > 800).all(), counts
    assert int(values.max()) <= 9999


def test_reward_exact_rules():
    task = AdditionTask()
    prompts = task.encode(torch.tensor([12, 12, 12, 12, 12, 12]), torch.tensor([345] * 6))
    responses = [
        tokens("753E"),  # right
        tokens("753E99"),  # right; tokens after EOS are ignored
        tokens("754E"),  # wrong digit
        tokens("753"),  # no EOS
        tokens("7530E"),  # extra digit
        tokens("75E"),  # too short
    ]
    assert task.reward(prompts, responses).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    padded = torch.full((6, 9), PAD)
    for i, r in enumerate(responses):
        padded[i, : len(r)] = torch.tensor(r)
    assert task.reward(prompts, padded).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_reward_rejects_row_count_mismatch():
    task = AdditionTask()
    prompts = task.encode(torch.tensor([1, 2]), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="responses"):
        task.reward(prompts, [tokens("4E")])


def test_cut_after_eos():
    rows = torch.tensor([[7, EOS, 8, EOS], [7, 8, 9, 9], [EOS, 5, 5, 5]])
    expected = torch.tensor([[7, EOS, PAD, PAD], [7, 8, 9, 9], [EOS, PAD, PAD, PAD]])
    assert torch.equal(cut_after_eos(rows), expected)


def test_reverse_by_hand_and_partial_credit():
    task = ReverseTask(min_digits=1, max_digits=5, reward_mode="partial")
    prompt = torch.tensor([[BOS, PAD, PAD, DIGIT0 + 1, DIGIT0 + 2, DIGIT0 + 3, EQUALS]])
    assert detokenize(task.answers(prompt)[0]) == "321<eos><pad><pad>"
    prompts = prompt.repeat(4, 1)
    responses = [tokens("321E"), tokens("324E"), tokens("32E"), tokens("3210E")]
    assert task.reward(prompts, responses).tolist() == pytest.approx([1.0, 0.75, 0.5, 0.75])
    exact = ReverseTask(min_digits=1, max_digits=5)
    assert exact.reward(prompts, responses).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_reverse_lengths_and_python_reversal():
    task = ReverseTask()
    prompts = task.make_prompts(200, torch.Generator().manual_seed(1))
    assert prompts.shape == (200, 65)
    lengths = task.answer_lengths(prompts)
    assert int(lengths.min()) >= 32 and int(lengths.max()) <= 64
    assert int(lengths.min()) <= 34 and int(lengths.max()) >= 62
    for prompt, answer in zip(prompts.tolist(), task.answers(prompts).tolist()):
        digits = [t for t in prompt[1:-1] if t != PAD]
        assert prompt[1 : 1 + 63 - len(digits)] == [PAD] * (63 - len(digits))
        assert answer[: len(digits) + 1] == digits[::-1] + [EOS]


def test_same_seed_same_prompts_and_held_out_eval():
    task = make_task("add", seed=3)
    first = task.make_prompts(64, task.generator())
    assert torch.equal(first, task.make_prompts(64, task.generator()))
    assert torch.equal(task.eval_prompts(64), task.eval_prompts(64))
    assert not torch.equal(first, task.eval_prompts(64))
    with pytest.raises(ValueError, match="eval_seed"):
        AdditionTask(seed=7, eval_seed=7)


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="unknown name"):
        make_task("sort")
    with pytest.raises(ValueError, match="prompts"):
        AdditionTask().answers(torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="reward_mode"):
        ReverseTask(reward_mode="fuzzy")
