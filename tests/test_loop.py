"""The one decode loop: step schedules, preparation before any step, and the guard around replayed steps."""

import contextlib

import pytest
import torch

from lantern.decoding.loop import Schedule, prepare, run_schedule
from lantern.decoding.tree.draft import chain


class Counter:
    def __init__(self):
        self.calls = []


def step_adding(amount):
    def step(ctx, state, audit):
        ctx.calls.append((amount, audit))
        return state + amount, amount

    return step


def test_a_schedule_runs_each_loop_step_as_its_kind_says_and_stops_when_done():
    ctx = Counter()
    schedule = Schedule({"one": step_adding(1), "ten": step_adding(10)}, kind=lambda i: "ten" if i % 3 == 1 else "one")
    state, logs = run_schedule(schedule, ctx, torch.zeros(2), 20, audit_every=2, done=lambda s: s >= 24)
    assert logs == [1, 10, 1, 1, 10, 1] and schedule.kinds(len(logs)) == ["one", "ten", "one", "one", "ten", "one"]
    assert float(state[0]) == 24 and [audit for _, audit in ctx.calls] == [False, True] * 3


def test_a_compiled_steps_first_call_captures_outside_the_guard_and_later_calls_run_inside():
    entered = []

    @contextlib.contextmanager
    def guard():
        entered.append(True)
        yield

    ctx = Counter()
    schedule = Schedule.of({"one": step_adding(1)}, "default", backend="eager")
    run_schedule(schedule, ctx, torch.zeros(2), 4, guard=guard)
    assert len(entered) == 3  # every call but the first (the one that captured the graph)
    eager = Schedule({"one": step_adding(1)})
    run_schedule(eager, Counter(), torch.zeros(2), 3, guard=guard)
    assert len(entered) == 6  # eager steps: always inside


def test_a_static_tree_grows_only_where_it_was_prepared():
    tree = chain(3)
    with pytest.raises(RuntimeError, match="prepare"):
        tree._on(torch.device("cpu"))
    prepare("cpu", tree, None, object())  # pieces without tables (or None) are passed over
    parents = tree._on(torch.device("cpu"))[-1][0]
    assert parents.tolist() == [-1, 0, 1, 2]
