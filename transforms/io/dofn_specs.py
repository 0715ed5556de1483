"""Beam's state-and-timer introspection, done once per DoFn class instead of at every look.

Beam asks `userstate.get_dofn_specs(dofn)` whether a DoFn is stateful each time it applies a
ParDo, translates the graph and builds a bundle processor; each answer wraps every method of the
DoFn and calls `inspect.signature` on it (about 30 per DoFn). A pipeline of a few hundred
transforms spent about 40% of a small run's CPU there (0.5 of 1.3 CPU-seconds for a tiny
pruned-synth run), and a worker pays it again per bundle processor.

The specs are the defaults of the methods' parameters (`state=DoFn.StateParam(...)`), which
live on the class, so the answer is cached per class. An instance that holds bound methods of
its own (which Beam's `dir()` walk would also inspect) is never cached. A first look that raises
(a DoFn with a duplicate parameter) raises every time, as before.

`install()` is idempotent; transforms/io/stage.py calls it on import, so the driver and every
worker process that unpickles a stage has it.
"""
from __future__ import annotations

import types
import weakref

from apache_beam.transforms import userstate


def _own_methods(dofn) -> bool:
    """Whether the instance itself holds bound methods (Beam's walk would see them too)."""
    state = getattr(dofn, "__dict__", None)
    return state is None or any(isinstance(v, types.MethodType) for v in state.values())


def _cached(uncached):
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


def install() -> None:
    """Route Beam's introspection (userstate.get_dofn_specs, which is_stateful_dofn and
    validate_stateful_dofn call by module name) through the per-class cache."""
    if not hasattr(userstate.get_dofn_specs, "uncached"):
        userstate.get_dofn_specs = _cached(userstate.get_dofn_specs)
