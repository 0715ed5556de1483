"""How a language model is prompted, shared by the pipeline that generates with a prompt and the
trainer that must train on the same format.

chat = the tokenizer's chat template (an instruct model); plain = the Alpaca/Self-Instruct text
prompt below, for a base model without a chat template; auto = plain when the tokenizer has no chat
template. The pipeline records the format it used on every row; the trainer reads it back, so a
model is trained on the format its data was generated in.
"""
from __future__ import annotations

PROMPT_FORMATS = ("auto", "chat", "plain")  # a config's prompt_format
PLAIN_PREAMBLE = ("Below is an instruction that describes a task. "
                  "Write a response that appropriately completes the request.")
# a base model runs on into the next "### Instruction:" block: these end the response there
PLAIN_STOP = ("\n### Instruction", "\n### Input", "\n### Response", "\nBelow is an instruction")


def plain_block(instruction: str, input_text: str = "", response: str | None = None) -> str:
    """One Alpaca block; with response=None it ends after "### Response:\n" (the model writes next)."""
    block = f"### Instruction:\n{instruction.strip()}\n\n"
    if input_text and input_text.strip():
        block += f"### Input:\n{input_text.strip()}\n\n"
    block += "### Response:\n"
    return block if response is None else block + response.strip() + "\n\n"


def plain_prompt(instruction: str, input_text: str = "", demonstrations=()) -> str:
    """The plain-completion prompt: the preamble, solved demonstrations ({instruction, input,
    output}), then the task, ending where the response starts. The trainer uses it without
    demonstrations, the pipeline with the seed demonstrations."""
    demos = "".join(plain_block(d["instruction"], d.get("input", ""), d["output"]) for d in demonstrations)
    return f"{PLAIN_PREAMBLE}\n\n{demos}{plain_block(instruction, input_text)}"
