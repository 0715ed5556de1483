"""Beam's `PipelineOptions.view_as`, built once per options object and view class.

Every `view_as(cls)` builds an argparse parser of all of `cls`'s options and parses the flags
again, although after the first view of a class its values live in the options' shared
dictionary and a new view only reads them there. Beam asks for views hundreds of times while it
applies, type-checks and translates a graph (485 times for a small pruned-synth run): about a
fifth of a small run's CPU, and 6% of the pipeline tests' time.

The view returned for (options, class) is kept and returned again while the options keep their
flags and their dictionary. A view reads and writes that shared dictionary, as every view does,
so handing out the same one changes nothing a caller can see but its identity.

`install()` is idempotent; transforms/io/stage.py calls it on import, so the driver and every
worker process that unpickles a stage has it.
"""
from __future__ import annotations

import weakref

from apache_beam.options.pipeline_options import PipelineOptions


def _cached(uncached):
    views: "weakref.WeakKeyDictionary[PipelineOptions, dict]" = weakref.WeakKeyDictionary()

    def view_as(self, cls):
        try:
            mine = views[self]
        except KeyError:
            mine = views[self] = {}
        view = mine.get(cls)
        if view is None or view._all_options is not self._all_options or view._flags is not self._flags:
            view = mine[cls] = view_as.uncached(self, cls)
        return view
    view_as.uncached = uncached
    view_as.__doc__ = uncached.__doc__
    return view_as


def install() -> None:
    """Route `PipelineOptions.view_as` through the per-object cache."""
    if not hasattr(PipelineOptions.view_as, "uncached"):
        PipelineOptions.view_as = _cached(PipelineOptions.view_as)
