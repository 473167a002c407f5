# ---------------------------------------------------------------------------------------------
# The model (a Hugging Face transformer built from its config) and its data
# ---------------------------------------------------------------------------------------------
def build_model():
    """The model this script was generated for, freshly initialised from its config (no download)."""
    import transformers

    cfg = dict(HF_CONFIG)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = ATTN_IMPLEMENTATION
    return getattr(transformers, HF_MODEL_CLASS)(config)


def make_sample(g: torch.Generator, index: int) -> dict:
    """One synthetic training sample: SEQ_LEN random token ids, predicting themselves shifted by one."""
    ids = torch.randint(0, VOCAB_SIZE, (SEQ_LEN,), generator=g)
    return {"input_ids": ids, "labels": ids, "index": index}


def compute_loss(model, batch: dict, device, dtype=None):
    """Forward pass and per-rank mean loss (pitfall 9: a mean per rank; DDP averages gradients)."""
    ids = batch["input_ids"].to(device, non_blocking=True)
    return model(input_ids=ids, labels=batch["labels"].to(device, non_blocking=True)).loss
# [lora]


# --- LoRA's frozen base (a Hugging Face checkpoint) ---
# [/lora]
# [lora16]
def build_base(args, dtype):
    """LoRA's frozen base: --init-from DIR loads a save_pretrained directory with from_pretrained in ``dtype`` (16
    bits under bf16/fp16: what a pretrained base is trained on); without it the model is freshly initialised from
    its config (a smoke test: the adapters then learn on a random base). ``dtype`` None: as built (fp32)."""
    import transformers

    if not args.init_from:
        model = build_model()
        if dtype is not None:  # the parameters only: buffers (rotary tables) stay as built, as from_pretrained does
            for p in model.parameters():
                if p.is_floating_point():
                    p.data = p.data.to(dtype)
        return model
    return getattr(transformers, HF_MODEL_CLASS).from_pretrained(
        args.init_from, dtype=dtype or torch.float32, attn_implementation=ATTN_IMPLEMENTATION)
# [/lora16]
# [qlora]
def quantization_config():
    """bitsandbytes' storage of the frozen base (transformers' BitsAndBytesConfig): 4-bit QUANTIZE (nf4/fp4) with
    optional double quantization, computing in BNB_COMPUTE_DTYPE; or LLM.int8() (int8)."""
    import transformers

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[BNB_COMPUTE_DTYPE]
    if QUANTIZE == "int8":
        return transformers.BitsAndBytesConfig(load_in_8bit=True)
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANTIZE,
                                           bnb_4bit_use_double_quant=DOUBLE_QUANT, bnb_4bit_compute_dtype=compute)


def save_test_base(out: str) -> str:
    """QLoRA without --init-from: bitsandbytes quantizes a base as from_pretrained loads it, so a freshly initialised
    base is first saved with save_pretrained into --out/test-base (rank 0; the others wait) and loaded from there.
    Random weights: for smoke tests and --verify only. Run before the memory meter starts."""
    path = os.path.join(out, "test-base")
    if int(os.environ.get("RANK", "0")) == 0:
        log(f"QLoRA without --init-from: saving a freshly initialised base to {path} (random weights, a test-only "
            "base: pass --init-from DIR to fine-tune a pretrained one)")
        os.makedirs(out, exist_ok=True)
        torch.manual_seed(SEED)
        build_model().save_pretrained(path)
    barrier()
    return path


def load_quantized_base(path: str, device):
    """QLoRA's frozen base: from_pretrained with the BitsAndBytesConfig (the linear layers are quantized as they
    load, onto ``device``), then peft's prepare_model_for_kbit_training: every parameter frozen and the
    non-quantized ones (embeddings, norms, LM head) in fp32. Activation checkpointing is not turned on here (its
    use_gradient_checkpointing): the script enables it as every strategy does, non-reentrant, when
    ACTIVATION_CHECKPOINTING."""
    import peft
    import transformers

    model = getattr(transformers, HF_MODEL_CLASS).from_pretrained(
        path, quantization_config=quantization_config(), dtype=torch.float32, device_map={"": str(device)},
        attn_implementation=ATTN_IMPLEMENTATION)
    return peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
# [/qlora]
