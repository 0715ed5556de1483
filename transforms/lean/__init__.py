"""Lean 4: problems, the REPL, tactic states and the RMaxTS search (PAPERS.md section 4)."""
