"""advisor: per-GPU memory estimates, a parallel-strategy recommendation and verified training
scripts for PyTorch. Heavy imports (torch, transformers, deepspeed, streamlit) stay lazy."""

__version__ = "0.1.0"
