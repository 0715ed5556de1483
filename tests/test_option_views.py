"""Beam's options views, built once per options object and view class (transforms/io/option_views.py)."""
from apache_beam.options.pipeline_options import (DirectOptions, PipelineOptions, SetupOptions, StandardOptions,
                                                  TypeOptions)

from transforms.io import option_views
from transforms.io import stage  # noqa: F401  (installs the cache on import, as every pipeline does)


def test_installed_once_and_a_view_is_built_once():
    assert hasattr(PipelineOptions.view_as, "uncached")
    option_views.install()
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
