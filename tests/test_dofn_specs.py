"""Beam's state-and-timer introspection, cached per DoFn class (transforms/io/dofn_specs.py)."""
import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer

from transforms.io import dofn_specs
from transforms.io import stage  # noqa: F401  (installs the cache on import, as every pipeline does)

BAG = BagStateSpec("seen", VarIntCoder())
TIMER = TimerSpec("flush", TimeDomain.WATERMARK)


class RunningCount(beam.DoFn):
    """A stateful DoFn: the n-th value of a key comes out as n."""

    def process(self, kv, seen=beam.DoFn.StateParam(BAG)):
        seen.add(1)
        yield kv[0], sum(seen.read())


class WithTimer(beam.DoFn):
    def process(self, kv, flush=beam.DoFn.TimerParam(TIMER)):
        yield kv

    @on_timer(TIMER)
    def on_flush(self):
        return []


class Plain(beam.DoFn):
    def process(self, x):
        yield x


class Counting:
    """Beam's own function, counted."""

    def __init__(self):
        self.calls = 0

    def __call__(self, dofn):
        self.calls += 1
        return userstate.get_dofn_specs.uncached(dofn)


def test_installed_once_and_the_answers_are_beams():
    dofn_specs.install()
    dofn_specs.install()
    assert not hasattr(userstate.get_dofn_specs.uncached, "uncached")   # wrapped once, not twice
    uncached = userstate.get_dofn_specs.uncached
    for fn in (RunningCount(), WithTimer(), Plain()):
        assert userstate.get_dofn_specs(fn) == uncached(fn)
        assert userstate.get_dofn_specs(fn) == uncached(fn)   # the cached answer too
    assert userstate.get_dofn_specs(RunningCount()) == ({BAG}, set())
    assert userstate.is_stateful_dofn(WithTimer()) and not userstate.is_stateful_dofn(Plain())


def test_one_look_per_class_and_none_for_instances_with_their_own_methods():
    counting = Counting()
    specs = dofn_specs._cached(counting)
    for _ in range(3):
        assert specs(RunningCount()) == ({BAG}, set())
    assert counting.calls == 1
    specs(RunningCount())[0].add("poison")          # a caller's set is its own
    assert specs(RunningCount()) == ({BAG}, set())
    odd = Plain()
    odd.helper = RunningCount().process             # a bound method Beam's dir() walk would inspect
    specs(odd), specs(odd)
    assert counting.calls == 3


def test_a_duplicate_parameter_is_refused_every_time():
    class Twice(beam.DoFn):
        def process(self, x, a=beam.DoFn.StateParam(BAG), b=beam.DoFn.StateParam(BAG)):
            yield x

    for _ in range(2):
        with pytest.raises(ValueError, match="duplicate"):
            userstate.get_dofn_specs(Twice())


def test_a_stateful_dofn_keeps_its_state_in_a_pipeline():
    with beam.Pipeline("FnApiRunner") as p:
        out = p | beam.Create([("a", 0), ("b", 0), ("a", 0), ("a", 0)]) | beam.ParDo(RunningCount())
        assert_that(out, equal_to([("a", 1), ("a", 2), ("a", 3), ("b", 1)]))
