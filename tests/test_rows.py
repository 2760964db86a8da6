"""specdec.rows: each row's tokens, stopping rules and the K bound of the next step (host-side bookkeeping)."""
import pytest
import torch

from specdec.rows import Rows, stop_index


def test_a_row_keeps_tokens_up_to_eos_budget_or_stop_string():
    decode = lambda tokens: "".join(f"<{t}>" for t in tokens)  # noqa: E731
    rows = Rows([3, 3, 3], 5, eos=[9], stop_strings=["<4><5>"], decode=decode)
    rows.absorb([[1, 2], [1, 9, 7], [4]])
    assert rows.tokens == [[1, 2], [1, 9], [4]] and rows.active == [True, False, True]
    rows.absorb([[3, 4, 5, 6], [8], [5, 6]])
    assert rows.tokens == [[1, 2, 3, 4, 5], [1, 9], [4, 5]] and rows.active == [False, False, False]
    sequences, n = rows.sequences(torch.zeros(3, 2, dtype=torch.long), pad_token_id=0)
    assert n.tolist() == [5, 2, 2] and sequences.shape == (3, 7)


def test_the_streamer_gets_exactly_the_tokens_a_row_keeps():
    """A step may emit tokens past a stop string, an EOS or the budget: the streamer gets none of them (found by
    session 34's fuzz: tokens after a stop string were streamed though the output dropped them)."""
    decode = lambda tokens: "".join(f"<{t}>" for t in tokens)  # noqa: E731

    class Recorder:
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens += value.reshape(-1).tolist()

        def end(self):
            pass

    for stop, eos, budget, steps in ((["<4><5>"], [], 9, [[1, 4], [5, 6, 7]]), (["<3>"], [], 9, [[1, 2, 3, 4]]),
                                     ([], [5], 9, [[4, 5, 6]]), ([], [], 3, [[1, 2], [3, 4, 5]])):
        rec = Recorder()
        rows = Rows([2], budget, eos=eos, stop_strings=stop, decode=decode, streamer=rec)
        for new in steps:
            rows.absorb([new])
        assert rec.tokens == rows.tokens[0] and not rows.active[0], (stop, eos, budget)


def test_room_for_k_counts_the_most_the_late_tokens_may_have_spent():
    rows = Rows([4, 4], 10)
    rows.absorb([[1] * 5, [1] * 2])
    assert rows.room_for(4) and not rows.room_for(5)  # row 0: 5 kept + 4 drafts + 1 token = 10


def test_stop_index_finds_the_token_that_completes_the_string():
    text = lambda tokens: "".join(map(str, tokens))  # noqa: E731
    assert stop_index(text, [1, 2, 3, 4], ["23"]) == 3
    assert stop_index(text, [1, 2, 3, 4], ["5"]) is None


@pytest.mark.parametrize("kept, k, max_positions, want", [
    ([1, 1], 4, None, 4),        # the schedule's K
    ([6, 1], 4, None, 4),        # the row with the most room decides
    ([6, 6], 4, None, 1),        # 8 - 6 - 1: the next token needs room too
    ([1, 1], 4, 12, 1),          # root at position 10 + 1 - 1 = 10, last position 11: one draft
])
def test_the_next_k_is_bounded_by_budgets_and_positions(kept, k, max_positions, want):
    rows = Rows([10, 10], 8)
    rows.absorb([[0] * n for n in kept])
    assert rows.num_drafts(k, max_positions) == want


def test_the_active_mask_is_rebuilt_only_when_a_row_finishes():
    rows = Rows([2, 2], 3, eos=[7])
    first = rows.active_mask("cpu")
    rows.absorb([[1], [2]])
    assert rows.active_mask("cpu") is first
    rows.absorb([[7], [2]])
    assert rows.active_mask("cpu").tolist() == [False, True]


def test_late_tokens_count_against_the_budget_at_once_and_are_read_at_the_next_absorb():
    from specdec.step import LateTokens

    rows = Rows([4, 4], 3, eos=[9])
    rows.absorb([[1], [2]])
    late = LateTokens(torch.tensor([9, 5]))  # row 0 emits EOS; the host does not know it yet
    rows.absorb(late)
    assert rows.tokens == [[1], [2]]  # kept aside, not read
    assert rows.active == [True, True] and rows.num_drafts(4, None) == 0  # 1 + 1 late of 3: room for 1 token
    rows.absorb(LateTokens(torch.tensor([7, 6])))  # the next step: the late one is read first, in order
    assert rows.tokens == [[1, 9], [2, 5]]
    assert rows.active == [False, False]  # row 0 stopped at EOS; row 1's budget is spent by the late token
    rows.finish()  # reads the last late tokens: row 0's 7 comes after its EOS and is dropped
    assert rows.tokens == [[1, 9], [2, 5, 6]]


def test_late_tokens_are_read_before_the_next_step_s_tokens():
    from specdec.step import LateTokens

    rows = Rows([2], 10)
    rows.absorb(LateTokens(torch.tensor([3])))
    rows.absorb([[4, 5, 6]])  # a step with drafts after a plain step
    assert rows.tokens == [[3, 4, 5, 6]]
    assert LateTokens(torch.tensor([1, 2])).lengths == [1, 1] and list(LateTokens(torch.tensor([8]))) == [[8]]


def _late_rows(rows_of_tokens: list[list[int]], width: int):
    """A tree step's late tokens: packed [count, tokens..., -1 padding] per row, read back into lists."""
    from specdec.step import LateTokens

    packed = torch.tensor([[len(t)] + t + [-1] * (width - len(t)) for t in rows_of_tokens])
    return LateTokens.of_rows(packed, lambda host: [row[1:1 + row[0]] for row in host], width)


def test_a_late_tree_step_counts_one_token_for_budgets_and_its_most_for_positions():
    rows = Rows([4, 4], 20)
    late = _late_rows([[1, 2, 3], [4]], 4)
    assert late.lengths is None and late.max_length == 4  # unknown until read
    rows.absorb(late)
    assert rows.tokens == [[], []]  # kept aside: far from any budget
    assert rows.num_drafts(8, None) == 8
    # positions: 4 prompt tokens + at most 4 late ones; the root sits at 4 + 4 - 1 = 7, so K <= 9 - 1 - 7
    assert rows.num_drafts(8, 9) == 1
    rows.absorb([[5], [6]])
    assert rows.tokens == [[1, 2, 3, 5], [4, 6]] and late.lengths == [3, 1]


def test_late_tree_tokens_that_may_reach_a_budget_are_read_at_once():
    rows = Rows([4, 4], 5)
    rows.absorb([[1], [2]])
    rows.absorb(_late_rows([[3, 4, 5, 6], [7]], 4))  # row 0 may reach its budget inside them: read now
    assert rows.tokens == [[1, 3, 4, 5, 6], [2, 7]]
    assert rows.active == [False, True]  # no step is planned for row 0
