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
