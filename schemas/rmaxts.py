"""rmaxts: Lean 4 proof search traces of RMaxTS (DeepSeek-Prover-V1.5, ICLR 2025; docs/papers/rmaxts.md).

Four tables: the problems searched, every attempt (a sampled proof and the Lean REPL's verdict),
the search tree's nodes (tactic states, one per goal path from the root, with their statistics), and the state -> tactic
transitions a prover is fine-tuned on (from the search, or converted from LeanDojo traces).
"""
import pyarrow as pa

from schemas.table import Field, TableSchema

DATASET = "rmaxts"

MESSAGE = pa.struct([
    pa.field("severity", pa.string(), nullable=False),
    pa.field("line", pa.int32(), nullable=False),
    pa.field("column", pa.int32(), nullable=False),
    pa.field("end_line", pa.int32()),
    pa.field("end_column", pa.int32()),
    pa.field("data", pa.string(), nullable=False),
])

PROBLEMS = TableSchema(
    dataset=DATASET,
    table="problems",
    version=1,
    doc="The theorems searched, with the outcome of the search.",
    split_field="split",
    fields=(
        Field("id", pa.string(), "Stable hash of the problem's name, header and statement."),
        Field("name", pa.string(), "Theorem name, e.g. amc12a_2019_p21."),
        Field("split", pa.string(), "valid, test, or the split the input names ('' when none)."),
        Field("source", pa.string(), "jsonl (DeepSeek style), lean (a .lean file), or leandojo."),
        Field("header", pa.string(), "Imports and opens the statement needs (loaded once per REPL process)."),
        Field("informal_prefix", pa.string(), "The natural-language statement as a Lean comment ('' when none)."),
        Field("formal_statement", pa.string(), "The theorem up to and including ':= by'."),
        Field("goal", pa.string(), "The initial tactic state ('' when the input has none)."),
        Field("attempts", pa.int64(), "Proofs sampled and verified for this problem."),
        Field("solved", pa.bool_(), "Whether some attempt was complete (the search stops early then)."),
        Field("proof", pa.string(), "The first complete proof found; null when unsolved.", nullable=True),
    ),
)

ATTEMPTS = TableSchema(
    dataset=DATASET,
    table="attempts",
    # 2: outcome `target`; a v1 `complete` was judged without checking the problem's declaration.
    # 3: no verify_time: a row is the same on every runner and in every rerun; the checks' time is the
    # `search` stage's busy_s and cpu_s in the manifest
    version=3,
    doc="One sampled proof: the prompt prefix it continued, the code checked and the REPL's verdict.",
    split_field="outcome",
    fields=(
        Field("id", pa.string(), "Stable hash of the problem, the attempt index and the proof code."),
        Field("problem_id", pa.string(), "The `problems` row."),
        Field("index", pa.int64(), "Order of the attempt in the search (0-based)."),
        Field("node_id", pa.string(), "The tree node that was expanded (whose prefix the model continued)."),
        Field("prefix", pa.string(), "Proof prefix given to the model (truncate-and-resume), '' at the root."),
        Field("completion", pa.string(), "The model's raw output."),
        Field("proof_code", pa.string(), "The full code checked: statement + proof (empty when none was found)."),
        Field("outcome", pa.string(), "complete, pass (no error, but sorry or warning), fail (Lean errors), "
              "refused (the sandbox refused the code), axioms (Lean accepted it, but it rests on an axiom other "
              "than propext, Classical.choice, Quot.sound), target (Lean accepted it, but it does not prove the "
              "problem's declaration: a scope left open, the name missing at the root, or another type), no_code (no code block in the output), timeout, "
              "crashed (the REPL died on it), or protocol_error (the REPL's output broke the protocol: "
              "a forged or extra reply; the process was killed)."),
        Field("passed", pa.bool_(), "No message of severity error."),
        Field("complete", pa.bool_(), "Passed with no sorry and no warning that says 'declaration uses sorry' or contains "
              "'failed' (DeepSeek-Prover-V1.5's verifier)."),
        Field("messages", pa.list_(MESSAGE), "The REPL's messages (positions relative to the checked code)."),
        Field("reason", pa.string(), "Why the attempt failed, in a line ('' when complete).", nullable=True),
        Field("new_nodes", pa.int64(), "Tree nodes this attempt added (its intrinsic reward is 1 when > 0)."),
    ),
)

NODES = TableSchema(
    dataset=DATASET,
    table="nodes",
    version=2,
    doc="RMaxTS tree nodes: the tactic states of a problem, one per goal path from the root (children keyed "
        "per parent by goal text, as DeepSeek-Prover-V1.5's tree), with their visit and reward statistics.",
    fields=(
        Field("id", pa.string(), "Stable hash of the problem and the goals on the path from the root."),
        Field("problem_id", pa.string(), "The `problems` row."),
        Field("goal", pa.string(), "The tactic state (pretty-printed goals); '' for the root before any tactic."),
        Field("parent_id", pa.string(), "The parent node (the state before this one on its path); null for the root.",
              nullable=True),
        Field("depth", pa.int32(), "Tactic lines from the root."),
        Field("prefixes", pa.list_(pa.string()), "The distinct proof prefixes that reach this state along this path."),
        Field("visits", pa.int64(), "N: times the node was on a selected path."),
        Field("reward", pa.float64(), "Discounted sum of intrinsic rewards backed up through the node."),
        Field("value", pa.float64(), "reward / visits (0 when unvisited)."),
    ),
)

TRANSITIONS = TableSchema(
    dataset=DATASET,
    table="transitions",
    version=1,
    doc="state_before -> tactic -> state_after steps for supervised fine-tuning of the prover.",
    split_field="source",
    fields=(
        Field("id", pa.string(), "Stable hash of the problem, the states and the tactic."),
        Field("problem_id", pa.string(), "The `problems` row ('' for LeanDojo theorems outside the problems)."),
        Field("source", pa.string(), "search (from verified attempts) or leandojo (converted traces)."),
        Field("state_before", pa.string(), "Goals before the tactic."),
        Field("tactic", pa.string(), "The tactic code."),
        Field("state_after", pa.string(), "Goals after the tactic ('' when it closed the goal; 'no goals' as Lean "
              "prints it is normalised to '')."),
        Field("prefix", pa.string(), "Statement and proof lines before the tactic (for truncate-and-resume prompts)."),
    ),
)

TABLES = (PROBLEMS, ATTEMPTS, NODES, TRANSITIONS)
