"""Exchange-aware trimming: properties over arbitrary windows (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hippo_summariser.domain.models import Role, WindowTurn
from hippo_summariser.domain.trimming import exchanges, needs_merge, next_merge, tokens, trim

ROLES = st.sampled_from([Role.USER, Role.ASSISTANT, Role.SYSTEM, Role.TOOL])


@st.composite
def windows(draw: st.DrawFn) -> list[WindowTurn]:
    # Mostly alternating user/assistant like real chats, with runs, system and tool turns.
    roles = draw(
        st.lists(
            st.one_of(ROLES, st.just(Role.USER), st.just(Role.ASSISTANT)), min_size=0, max_size=40
        )
    )
    costs = draw(st.lists(st.integers(1, 300), min_size=len(roles), max_size=len(roles)))
    return [
        WindowTurn(i, f"m{i}", role, f"t{i}", 0, "", cost)
        for i, (role, cost) in enumerate(zip(roles, costs, strict=True))
    ]


def starts_exchange(window: list[WindowTurn], i: int) -> bool:
    return window[i].role is Role.USER and (i == 0 or window[i - 1].role is not Role.USER)


@settings(max_examples=400, deadline=None)
@given(windows(), st.integers(1, 2000))
def test_dropped_plus_kept_is_the_window_in_order(window: list[WindowTurn], budget: int) -> None:
    result = trim(window, budget)
    assert list(result.dropped) + list(result.kept) == window


@settings(max_examples=400, deadline=None)
@given(windows(), st.integers(1, 2000))
def test_the_latest_exchange_is_always_kept(window: list[WindowTurn], budget: int) -> None:
    result = trim(window, budget)
    if window:
        latest = exchanges(window)[-1]
        assert result.kept[-len(latest) :] == latest
        assert set(latest) <= set(result.kept)


@settings(max_examples=400, deadline=None)
@given(windows(), st.integers(1, 2000))
def test_within_budget_unless_the_latest_exchange_alone_exceeds_it(
    window: list[WindowTurn], budget: int
) -> None:
    result = trim(window, budget)
    if len(exchanges(list(result.kept))) > 1:
        assert tokens(result.kept) <= budget
    # Maximal: the newest dropped exchange would not have fitted.
    if result.dropped:
        newest_dropped = exchanges(list(result.dropped))[-1]
        assert tokens(result.kept) + tokens(newest_dropped) > budget


@settings(max_examples=400, deadline=None)
@given(windows(), st.integers(1, 2000))
def test_alternation_is_never_broken(window: list[WindowTurn], budget: int) -> None:
    """The cut falls where an exchange starts: no reply loses the message it answers, and
    the kept window starts with the user's turn."""
    result = trim(window, budget)
    if result.dropped and result.kept:
        cut = len(result.dropped)
        assert starts_exchange(window, cut)
        assert result.kept[0].role is Role.USER
        assert result.dropped[-1].role is not Role.USER


@settings(max_examples=300, deadline=None)
@given(windows(), st.integers(1, 2000), st.floats(0.1, 1.0), st.integers(1, 3000))
def test_a_merge_takes_the_oldest_whole_exchanges(
    window: list[WindowTurn], budget: int, low: float, max_input: int
) -> None:
    low_water = max(1, int(budget * low))
    batch = next_merge(window, budget, low_water, max_input)
    assert bool(batch) == needs_merge(window, budget)
    if batch:
        # A prefix of the window, ending where an exchange ends; within max_input unless
        # one exchange alone is larger; never more than trimming to low water drops.
        assert list(batch) == window[: len(batch)]
        assert starts_exchange(window, len(batch)) or len(batch) == len(window)
        assert len(batch) <= len(trim(window, low_water).dropped)
        if len(exchanges(list(batch))) > 1:
            assert tokens(batch) <= max_input


def test_consecutive_user_turns_and_tool_turns_stay_with_their_exchange() -> None:
    roles = [Role.SYSTEM, Role.USER, Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    roles += [Role.USER, Role.ASSISTANT]
    window = [WindowTurn(i, f"m{i}", r, "", 0, "", 10) for i, r in enumerate(roles)]
    groups = exchanges(window)
    assert [len(g) for g in groups] == [1, 5, 2]
    assert [t.seq for t in trim(window, 25).kept] == [6, 7]
    assert [t.seq for t in trim(window, 70).kept] == list(range(1, 8))


def test_a_single_exchange_over_budget_is_kept_and_needs_no_merge() -> None:
    window = [
        WindowTurn(0, "a", Role.USER, "", 0, "", 900),
        WindowTurn(1, "b", Role.ASSISTANT, "", 0, "", 900),
    ]
    assert trim(window, 100).kept == tuple(window)
    assert not needs_merge(window, 100)
