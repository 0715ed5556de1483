"""Dead letters: inputs a stage could not process, kept with the reason."""
import pyarrow as pa

from schemas.table import Field, TableSchema

TABLE = TableSchema(
    dataset="*",
    table="_dead_letter",
    version=1,
    doc="Inputs that a stage rejected or failed on; the run went on without them.",
    split_field="stage",
    fields=(
        Field("id", pa.string(), "Stable hash of the stage, the error and the whole input."),
        Field("stage", pa.string(), "Name of the stage that rejected the input."),
        Field("error_type", pa.string(), "Exception class name, or the rejection kind."),
        Field("message", pa.string(), "Why the input was rejected: what to fix."),
        Field("excerpt", pa.string(), "The start of the input (at most 1,000 characters)."),
        Field("occurrences", pa.int64(),
              "How many times this same input failed this same way in the run (a repeated input "
              "is kept once, with its count)."),
    ),
)
