"""Lean 4: problems, the REPL, tactic states and the RMaxTS search (docs/papers/rmaxts.md)."""
