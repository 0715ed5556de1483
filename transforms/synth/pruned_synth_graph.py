"""Beam wiring of pruned-synth: real rows -> generator -> synthetic rows -> verifier."""
from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam

from transforms.io.stage import Ledger, payloads
from transforms.synth import experiment as ex
from transforms.synth import gaussian_mixture as gm


def _merge_stats(values):
    values = iter(values)
    total = next(values)
    for v in values:
        total = gm.merge_generator_stats(total, v)
    return total


@dataclass(frozen=True)
class PrunedSynthSettings:
    """Everything the graph reads, resolved by pipelines/pruned_synth.py from the config: one
    (experiment id, resolved params, swept keys) per point of the config's grid."""

    experiments: tuple[tuple[str, dict, list], ...]


class PrunedSynthGraph(beam.PTransform):
    """All experiments of a run: {"rows": (real, synthetic) Arrow chunks, "experiments": row dicts}.

    A repeated experiment id is run once. The generator is joined to its synthetic chunks with
    CoGroupByKey rather than a side input, which the DaskRunner does not support.
    """

    def __init__(self, settings: PrunedSynthSettings, ledger: Ledger):
        super().__init__()
        self.settings, self.ledger = settings, ledger

    def expand(self, pbegin):
        # a sweep that repeats a value (epsilon=[0.1,0.1]) repeats an experiment id: run it once
        experiments = (pbegin | "Experiments" >> beam.Create(list(self.settings.experiments))
                       | self.ledger.unique("unique_experiments", lambda e: e[0]))
        distinct = {exp: params for exp, params, _ in self.settings.experiments}
        real_count = sum(len(ex.plan(params, exp)[0]) for exp, params in distinct.items())  # the display's ETA
        real = (experiments
                | "RealTasks" >> beam.FlatMapTuple(lambda exp, params, _: ex.plan(params, exp)[0])
                | "SpreadReal" >> beam.Reshuffle()
                | self.ledger.stage("real_rows", ex.real_rows, expected=real_count))
        stats = (payloads(real, ex.STATS, "RealStats")
                 | "SumStats" >> beam.CombinePerKey(_merge_stats)
                 | "ByExperiment" >> beam.MapTuple(lambda key, s: (key[0], (key[1], s))))
        joined = {
            "experiment": experiments | "Meta" >> beam.MapTuple(
                lambda exp, params, swept: (exp, {"params": params, "swept": swept})),
            "stats": stats,
            "chunks": experiments | "SyntheticTasks" >> beam.FlatMapTuple(
                lambda exp, params, _: [(exp, t) for t in ex.plan(params, exp)[1]]),
        } | "JoinGenerator" >> beam.CoGroupByKey()
        fitted = joined | self.ledger.stage("generator", ex.generator)
        synthetic = (payloads(fitted, ex.SYNTH_TASK, "Tasks")
                     | "SpreadSynthetic" >> beam.Reshuffle()
                     | self.ledger.stage("synthetic_rows", ex.synthetic_rows))
        rows = (payloads(real, ex.ROWS, "RealRows"), payloads(synthetic, ex.ROWS, "SynthRows"))
        return {"rows": rows, "experiments": payloads(fitted, ex.EXPERIMENT, "ExperimentRows")}
