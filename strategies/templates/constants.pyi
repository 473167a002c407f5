# The constants block of a generated script (strategies/render.py ``_constants``: repr of validated data), as the
# template modules' checkers see it; the renderer writes each job's values.
COLLECTIVE_TIMEOUT_MINUTES: int
DS_CONFIG_FILE: str
GRAD_ACCUM_STEPS: int
HF_MODEL_CLASS: str
LORA_DTYPE: str
LR: float
MAX_GRAD_NORM: float
MICRO_BATCH_SIZE: int
PRECISION: str
REPLICATE_DEGREE: int
RESHARD_AFTER_FORWARD: bool
SEED: int
SYNC_BN_MAX_MICRO_BATCH: int
TP_DEGREE: int
