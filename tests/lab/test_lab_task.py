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
)
from mismatch_ctrl.lab.model.tasks import make_task


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


def _digitsum_reward_by_loop(prompt: list[int], response: list[int]) -> float:
    """Independent reference: the response as text, cut at its first '<eos>' (none: 0); a scratchpad ('+' first)
    must hold an '=' and its answer is what follows the last one, else the whole text is the answer; compared as text
    with the prompt's digit sum mod 4."""
    text = detokenize(response).replace("<pad>", "_")
    if "<eos>" not in text:
        return 0.0
    body = text.split("<eos>")[0]
    if body.startswith("+") and "=" not in body:
        return 0.0
    answer = body.rsplit("=", 1)[-1] if body.startswith("+") else body
    digits = [int(c) for c in detokenize(prompt[1:-1]) if c.isdigit()]
    return float(answer == str(sum(digits) % 4))


def _digitsum_task():
    from mismatch_ctrl.lab.model.digitsum import DigitSumTask

    return DigitSumTask(min_terms=3, max_terms=8, modulus=4)


def test_digitsum_prompt_and_both_forms_by_hand():
    task = _digitsum_task()
    prompt = torch.tensor([[BOS] + [DIGIT0 + d for d in (3, 2, 1)] + [PAD] * 5 + [EQUALS]])
    assert task.targets(prompt).tolist() == [DIGIT0 + 2]
    assert detokenize(task.answers(prompt)[0]) == "+312=2<eos><pad><pad><pad><pad><pad>"
    assert detokenize(task.direct_answers(prompt)[0]) == "2<eos>" + "<pad>" * 10
    prompts = task.make_prompts(500, torch.Generator().manual_seed(1))
    terms = (prompts[:, 1:-1] != PAD).sum(dim=1)
    assert set(terms.tolist()) == set(range(3, 9)) and prompts.shape == (500, 10)
    assert (prompts[:, 1:-1][prompts[:, 1:-1] != PAD] < DIGIT0 + 4).all()
    assert (task.answer_lengths(prompts) == terms + 4).all()
    assert task.generation_len == 36 and task.max_response_len == 12


def test_digitsum_reward_matches_a_per_sequence_parser():
    from mismatch_ctrl.lab.model.task import PLUS

    task = _digitsum_task()
    generator = torch.Generator().manual_seed(3)
    prompts = task.make_prompts(400, generator)
    vocabulary = torch.tensor([PAD, EOS, PLUS, EQUALS] + [DIGIT0 + d for d in range(4)])
    noise = vocabulary[torch.randint(0, len(vocabulary), (400, 14), generator=generator)]
    correct = torch.cat([task.answers(prompts), torch.full((400, 2), PAD)], dim=1)
    direct = torch.cat([task.direct_answers(prompts), torch.full((400, 2), PAD)], dim=1)
    pick = torch.randint(0, 4, (400, 1), generator=generator)
    mutated = correct.clone()
    where = torch.randint(0, 14, (400,), generator=generator)
    mutated[torch.arange(400), where] = noise[torch.arange(400), where]
    responses = torch.where(pick == 0, noise, torch.where(pick == 1, correct, torch.where(pick == 2, direct, mutated)))
    got = task.reward(prompts, responses)
    expected = [_digitsum_reward_by_loop(p.tolist(), r.tolist()) for p, r in zip(prompts, responses)]
    assert got.tolist() == expected
    assert 0.2 < got.mean() < 0.9  # both outcomes are exercised
    assert task.reward(prompts, task.answers(prompts)).eq(1).all()
    assert task.reward(prompts, task.direct_answers(prompts)).eq(1).all()


def test_digitsum_reward_edge_cases():
    from mismatch_ctrl.lab.model.task import PLUS

    task = _digitsum_task()
    prompt = torch.tensor([[BOS] + [DIGIT0 + d for d in (3, 2, 1)] + [PAD] * 5 + [EQUALS]])  # answer 2
    two, one = DIGIT0 + 2, DIGIT0 + 1
    cases = {
        (two, EOS): 1.0,                              # direct
        (PLUS, one, EQUALS, two, EOS): 1.0,           # a wrong scratchpad is not scored
        (PLUS, EQUALS, two, EOS): 1.0,                # an empty scratchpad
        (EQUALS, two, EOS): 0.0,                      # a scratchpad must open with '+'
        (two, EQUALS, two, EOS): 0.0,
        (PLUS, two, EOS): 0.0,                        # a scratchpad must close with '='
        (PLUS, EOS): 0.0,
        (two,): 0.0,                                  # no EOS
        (two, two, EOS): 0.0,                         # two digits
        (PLUS, EQUALS, EOS): 0.0,                     # no answer
        (PLUS, two, EQUALS, EOS, two): 0.0,           # the answer after EOS does not count
        (two, EOS, EQUALS, one, EOS): 1.0,            # nor does anything else after the first EOS
        (PLUS, two, EQUALS, one, EQUALS, two, EOS): 1.0,   # the last '=' before EOS decides
        (PLUS, two, EQUALS, two, EQUALS, one, EOS): 0.0,
    }
    for response, expected in cases.items():
        assert task.reward(prompt, [list(response)]).item() == expected, detokenize(response)
        assert _digitsum_reward_by_loop(prompt[0].tolist(), list(response)) == expected
    assert task.reward(prompt, torch.zeros(1, 0, dtype=torch.long)).tolist() == [0.0]
    with pytest.raises(ValueError, match="responses: 2 rows for 1 prompts"):
        task.reward(prompt, [[two, EOS], [two, EOS]])


def test_digitsum_demonstrations_mix_the_forms_and_weigh_the_opening():
    task = _digitsum_task()
    prompts = task.make_prompts(4000, torch.Generator().manual_seed(2))
    labels, weights = task.demonstrations(prompts, torch.Generator().manual_seed(4))
    scratch = task.rollout_metrics(labels)["scratch_fraction"]
    assert abs(scratch - task.scratch_share) < 0.03
    is_scratch = labels[:, 0] == task.answers(prompts)[:, 0]
    assert torch.equal(labels[is_scratch], task.answers(prompts)[is_scratch])
    assert torch.equal(labels[~is_scratch], task.direct_answers(prompts)[~is_scratch])
    s, o = task.scratch_share, task.opening_share
    w = weights[is_scratch, 0].unique()
    assert w.numel() == 1 and abs(float(w) - o * (1 - s) / (s * (1 - o))) < 1e-6
    assert (weights[~is_scratch, 0] == 1).all() and (weights[:, 1:] == 1).all()
    # the weighted cross-entropy of the opening token is lowest at P(open) = opening_share
    grid = torch.linspace(0.001, 0.999, 999)
    loss = -(weights[is_scratch, 0].sum() * grid.log() + (~is_scratch).sum() * (1 - grid).log())
    assert abs(float(grid[loss.argmin()]) - o) < 0.005


def test_digitsum_bad_options_name_the_field():
    from mismatch_ctrl.lab.model.digitsum import DigitSumTask

    for options, field in (({"modulus": 1}, "modulus"), ({"scratch_share": 0.0}, "scratch_share"),
                           ({"opening_share": 1.0}, "opening_share"), ({"min_terms": 4, "max_terms": 3}, "min_terms")):
        with pytest.raises(ValueError, match=field):
            DigitSumTask(**options)
