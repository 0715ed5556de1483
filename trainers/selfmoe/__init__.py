"""The Self-MoE trainers: a LoRA expert per domain, then the MiXSE router over the frozen experts.

    examples.py   the kept rows per domain, their eval split and SFT encoding
    mixture.py    the MiXSE mixture: MixLoRALinear gates over frozen LoRA experts, loading it back
    training.py   the expert and router recipes, `train` and its report
"""
