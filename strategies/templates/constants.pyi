# The constants block of a generated script (strategies/render.py ``_constants``: repr of validated data), as the
# template modules' checkers see it; the renderer writes each job's values.
COLLECTIVE_TIMEOUT_MINUTES: int
DATA_SEED: int
DS_CONFIG_FILE: str
EVAL_BATCHES: int
EVAL_EVERY: int
EVAL_SAMPLES: int
GRAD_ACCUM_STEPS: int
HF_MODEL_CLASS: str
INIT_FROM: str | None
KEEP_CHECKPOINTS: int
LORA_ALPHA: int
LORA_DROPOUT: float
LORA_DTYPE: str
LORA_RANK: int
LORA_TARGETS: str | list[str] | None
LORA_TASK_TYPE: str | None
LR: float
MAX_GRAD_NORM: float
MICRO_BATCH_SIZE: int
MODEL_FLOPS_PER_SAMPLE: int
NUM_SAMPLES: int
NUM_WORKERS: int
OPTIMIZER: str
PEAK_FLOPS_PER_GPU: float | None
PP_DEGREE: int
PP_SCHEDULE: str
PP_VIRTUAL_STAGES: int
PRECISION: str
REPLICATE_DEGREE: int
RESHARD_AFTER_FORWARD: bool
SAVE_EVERY: int
SEED: int
SEQ_LEN: int
SYNC_BN_MAX_MICRO_BATCH: int
TOTAL_STEPS: int
TP_DEGREE: int
WARMUP_STEPS: int
WEIGHT_DECAY: float
