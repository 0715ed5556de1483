"""Beam's repeated introspection, answered once: the two patches this project makes to Beam.

Both replace a Beam function by a cached one that gives callers the same answers; `install()` puts
both in place, idempotently. transforms/io/stage.py calls it on import, so the driver and every
worker process that unpickles a stage has them. docs/architecture.md ("Patches to Beam") lists them.

1. DoFn specs (`userstate.get_dofn_specs`). Beam asks whether a DoFn is stateful each time it
   applies a ParDo, translates the graph and builds a bundle processor; each answer wraps every
   method of the DoFn and calls `inspect.signature` on it (about 30 per DoFn). A pipeline of a few
   hundred transforms spent about 40% of a small run's CPU there (0.5 of 1.3 CPU-seconds for a
   tiny pruned-synth run), and a worker pays it again per bundle processor. The specs are the
   defaults of the methods' parameters (`state=DoFn.StateParam(...)`), which live on the class, so
   the answer is cached per class. An instance that holds bound methods of its own (which Beam's
   `dir()` walk would also inspect) is never cached. A first look that raises (a DoFn with a
   duplicate parameter) raises every time, as before.
2. Options views (`PipelineOptions.view_as`). Every `view_as(cls)` builds an argparse parser of
   all of `cls`'s options and parses the flags again, although after the first view of a class its
   values live in the options' shared dictionary and a new view only reads them there. Beam asks
   for views hundreds of times while it applies, type-checks and translates a graph (485 times for
   a small pruned-synth run): about a fifth of a small run's CPU. The view for (options, class) is
   kept and returned again while the options keep their flags and their dictionary; a view reads
   and writes that shared dictionary, as every view does, so handing out the same one changes
   nothing a caller can see but its identity.
"""
from __future__ import annotations

import types
import weakref

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate


def _own_methods(dofn) -> bool:
    """Whether the instance itself holds bound methods (Beam's walk would see them too)."""
    state = getattr(dofn, "__dict__", None)
    return state is None or any(isinstance(v, types.MethodType) for v in state.values())


def _cached_specs(uncached):
    cache: "weakref.WeakKeyDictionary[type, tuple]" = weakref.WeakKeyDictionary()

    def get_dofn_specs(dofn):
        cls = type(dofn)
        if _own_methods(dofn):
            return uncached(dofn)
        try:
            states, timers = cache[cls]
        except KeyError:
            states, timers = cache[cls] = uncached(dofn)
        return set(states), set(timers)   # callers get their own sets, as from Beam's function
    get_dofn_specs.uncached = uncached
    return get_dofn_specs


def _cached_views(uncached):
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
    """Route Beam's DoFn introspection (userstate.get_dofn_specs, which is_stateful_dofn and
    validate_stateful_dofn call by module name) and `PipelineOptions.view_as` through their caches."""
    if not hasattr(userstate.get_dofn_specs, "uncached"):
        userstate.get_dofn_specs = _cached_specs(userstate.get_dofn_specs)
    if not hasattr(PipelineOptions.view_as, "uncached"):
        PipelineOptions.view_as = _cached_views(PipelineOptions.view_as)
