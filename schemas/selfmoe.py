"""selfmoe: self-specialization data per domain (Self-MoE, ICLR 2025; docs/papers/selfmoe.md).

Every brainstormed instruction is kept as a row, with the reason when it was
dropped, so the filters can be audited and re-tuned from the shards alone.
"""
import pyarrow as pa

from schemas.table import Field, TableSchema

DATASET = "selfmoe"

EXAMPLES = TableSchema(
    dataset=DATASET,
    table="examples",
    version=3,  # 3: round, near_duplicate; reject_reason names the kind only
    doc="Seed and self-generated (instruction, input, response) examples per domain, kept or dropped.",
    split_field="domain",
    fields=(
        Field("id", pa.string(), "Stable hash of domain, instruction, input, model and sampling."),
        Field("domain", pa.string(), "Expert domain, e.g. knowledge, reasoning, math, coding."),
        Field("source", pa.string(), "seed: from the seed file; generated: brainstormed by the model."),
        Field("instruction", pa.string(), "The task, as the model (or the seed file) wrote it."),
        Field("input", pa.string(), "Optional input of the task ('' when none)."),
        Field("response", pa.string(), "The answer (null when the instruction was dropped before answering).",
              nullable=True),
        Field("seed_ids", pa.list_(pa.string()),
              "Ids of the seeds shown to the model when it brainstormed this instruction (empty for seeds)."),
        Field("model", pa.string(), "Model id (name@revision) that wrote the row; '' for seeds."),
        Field("sampling", pa.string(), "JSON of the sampling parameters of the response ('' for seeds)."),
        Field("rouge_l_max", pa.float64(),
              "Highest ROUGE-L F of the instruction against the seeds and earlier kept instructions "
              "(exact at or above the threshold; for kept rows, the highest among scored candidates); "
              "null for seeds and for instructions a filter dropped before the dedup.", nullable=True),
        Field("near_duplicate", pa.string(),
              "For a rouge_l or embedding drop: the seed or earlier instruction it matched (the score is "
              "rouge_l_max); null otherwise.", nullable=True),
        Field("kept", pa.bool_(), "Whether the example is training data for the domain's expert."),
        Field("reject_reason", pa.string(),
              "Why a row was dropped: rouge_l (near-duplicate), embedding (near-duplicate by embedding cosine, "
              "when embedding_threshold is set), empty, too_long, malformed, copied_seed, "
              "truncated (the response, or the brainstorm's last task, stopped at the token limit), "
              "refusal, over_target (beyond per_domain); null when kept.", nullable=True),
        Field("prompt_tokens", pa.int64(), "Tokens of the response prompt (0 when not answered)."),
        Field("completion_tokens", pa.int64(), "Tokens of the response (0 when not answered)."),
        Field("prompt_format", pa.string(),
              "How the responses of this dataset were prompted, and how to format the row for training: "
              "chat (the model's chat template) or plain (the Alpaca-style text prompt of schemas/selfmoe.py, "
              "for a base model without a chat template). Seeds carry the dataset's format too."),
        Field("round", pa.int32(),
              "The brainstorm round that proposed the instruction (1, 2, ...: rounds run until the domain "
              "holds per_domain kept examples or the rounds key is reached); 0 for seeds."),
    ),
)

TABLES = (EXAMPLES,)
