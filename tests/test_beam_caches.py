"""Beam's DoFn introspection cached per DoFn class, and its options views built once per options object
and view class (transforms/io/beam_caches.py)."""
import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import (DirectOptions, PipelineOptions, SetupOptions, StandardOptions,
                                                  TypeOptions)
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer

from transforms.io import beam_caches
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
    beam_caches.install()
    beam_caches.install()
    assert not hasattr(userstate.get_dofn_specs.uncached, "uncached")   # wrapped once, not twice
    uncached = userstate.get_dofn_specs.uncached
    for fn in (RunningCount(), WithTimer(), Plain()):
        assert userstate.get_dofn_specs(fn) == uncached(fn)
        assert userstate.get_dofn_specs(fn) == uncached(fn)   # the cached answer too
    assert userstate.get_dofn_specs(RunningCount()) == ({BAG}, set())
    assert userstate.is_stateful_dofn(WithTimer()) and not userstate.is_stateful_dofn(Plain())


def test_one_look_per_class_and_none_for_instances_with_their_own_methods():
    counting = Counting()
    specs = beam_caches._cached_specs(counting)
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


def test_installed_once_and_a_view_is_built_once():
    assert hasattr(PipelineOptions.view_as, "uncached")
    beam_caches.install()
    assert not hasattr(PipelineOptions.view_as.uncached, "uncached")      # not wrapped twice
    calls = []
    uncached = PipelineOptions.view_as.uncached
    options = PipelineOptions(["--runner=DirectRunner", "--direct_num_workers=3"])
    PipelineOptions.view_as.uncached = lambda self, cls: calls.append(cls) or uncached(self, cls)
    try:
        first = options.view_as(StandardOptions)
        assert options.view_as(StandardOptions) is first and calls == [StandardOptions]
        assert options.view_as(DirectOptions).direct_num_workers == 3 and calls == [StandardOptions, DirectOptions]
    finally:
        PipelineOptions.view_as.uncached = uncached


def test_views_read_and_write_the_options_values_as_beams_do():
    options = PipelineOptions(["--runner=DirectRunner", "--no_pipeline_type_check"])
    assert options.view_as(StandardOptions).runner == "DirectRunner"
    assert options.view_as(TypeOptions).pipeline_type_check is False
    options.view_as(SetupOptions).save_main_session = True                # written through one view ...
    assert options.view_as(SetupOptions).save_main_session is True        # ... read through the next
    assert options.get_all_options()["save_main_session"] is True
    other = PipelineOptions([])                                           # another object: its own views
    assert not other.view_as(SetupOptions).save_main_session
    assert other.view_as(SetupOptions) is not options.view_as(SetupOptions)


def test_a_view_is_built_again_when_the_options_values_are_replaced():
    options = PipelineOptions(["--direct_num_workers=2"])
    before = options.view_as(DirectOptions)
    options._all_options = {}            # as Beam's own copies do: the old view no longer reads these values
    after = options.view_as(DirectOptions)
    assert after is not before and after.direct_num_workers == 2 and after._all_options is options._all_options
