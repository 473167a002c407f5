# --- The model (a Hugging Face transformer) and its data ---
INIT_FROM_HELP = ("pretrained weights to start from: a save_pretrained directory or a hub id (from_pretrained); "
                  "without it the model is freshly initialised from its config")
DATA_HELP = ("training text: a .txt file, a .jsonl file with a 'text' field per line, or a datasets directory "
             "(save_to_disk) with a 'text' column; tokenized with --tokenizer, cut into SEQ_LEN-token blocks, "
             "the last HELD_OUT_FRACTION of them held out for evaluation")


def pretrained(load, source: str, flag: str = "--init-from", **kwargs):
    """``load(source, **kwargs)`` (a from_pretrained) with a one-line error for what it cannot load."""
    if os.path.isfile(source):
        raise SystemExit(f"{flag} {source}: a file; a transformers model loads a save_pretrained directory (such as "
                         "the --out/model this script exports) or a hub id")
    try:
        return load(source, **kwargs)
    except (OSError, ValueError) as err:
        first = (str(err).splitlines() or [""])[0][:200]
        raise SystemExit(f"{flag} {source}: cannot load it ({first})") from None


def build_model(init_from=None):
    """--init-from's pretrained weights in fp32 (mixed precision casts per op; the optimizer steps fp32 weights), or
    without it the model freshly initialised from its config."""
    import transformers

    cls = getattr(transformers, HF_MODEL_CLASS)
    if init_from:
        model = pretrained(cls.from_pretrained, init_from, dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION)
        changed = [k for k, v in HF_CONFIG.items() if isinstance(v, int) and getattr(model.config, k, v) != v]
        if changed:
            log(f"warning: {init_from} differs from the config this script was planned for ({', '.join(changed[:4])}):"
                " the memory estimate does not apply")
        return model
    cfg = dict(HF_CONFIG)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = ATTN_IMPLEMENTATION
    return fresh_model(cls, config)


def fresh_model__as_built(cls, config):
    """The model freshly initialised from its config."""
    return cls(config)


def fresh_model__untied(cls, config):
    """The model freshly initialised from its config, its LM head apart from the input embedding: the config file
    says tie_word_embeddings false, which this config class reads only as "do not scale the decoder output" and ties
    the two anyway; a checkpoint that stores its own head loads apart (from_pretrained keeps both), so a fresh model
    gets its own head too (a copy of the embedding's initial values)."""
    model = cls(config)
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    return model


fresh_model = fresh_model__as_built


def make_sample(g: torch.Generator) -> dict:
    """A synthetic sample: SEQ_LEN random token ids (the model shifts the labels by one itself)."""
    ids = torch.randint(0, VOCAB_SIZE, (SEQ_LEN,), generator=g)
    return {"input_ids": ids, "labels": ids}


def load_real_dataset(args):
    """(training blocks, held-out blocks) from --data, tokenized with --tokenizer (else --init-from's tokenizer) and
    packed into SEQ_LEN-token blocks (data.py)."""
    import transformers

    source = args.tokenizer or args.init_from  # one of them: parse_args refuses --data without
    tokenizer = pretrained(transformers.AutoTokenizer.from_pretrained, source,
                           "--tokenizer" if args.tokenizer else "--init-from")
    train, held_out, said = data.packed_blocks(args.data, tokenizer, source, SEQ_LEN, VOCAB_SIZE, HELD_OUT_FRACTION)
    log(said)
    return train, held_out


def compute_loss__plain(model, batch: dict, device, dtype=None):
    """This rank's mean loss (a mean per rank: the gradients are averaged over the ranks)."""
    ids = batch["input_ids"].to(device, non_blocking=True)
    return model(input_ids=ids, labels=batch["labels"].to(device, non_blocking=True)).loss


def compute_loss__chunked(model, batch: dict, device, dtype=None):
    """This rank's mean loss by chunked cross-entropy (ChunkedCrossEntropy): CE_CHUNKS slices of the logits at a time
    in fp32, keeping for backward only the logits in their own dtype and one log-sum-exp per token, instead of the
    whole batch's fp32 log-softmax and its two fp32 gradients."""
    ids = batch["input_ids"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    # Each position predicts the next token (transformers' causal-LM loss shifts the labels the same way); the last
    # position has none.
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    logits = model(input_ids=ids).logits
    return ChunkedCrossEntropy.apply(logits.flatten(0, 1), targets.flatten(), CE_CHUNKS, IGNORE_INDEX)


compute_loss = compute_loss__plain


def export_weights(model, args, state_dict=None) -> None:
    """Rank 0: --out/model, a save_pretrained directory (safetensors, and --tokenizer's / --init-from's tokenizer)
    that from_pretrained loads into the plain model; ``state_dict``: the full weights a sharded strategy gathered."""
    path = os.path.join(args.out, "model")
    model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
    source = getattr(args, "tokenizer", None) or args.init_from
    if source:
        import transformers

        try:
            transformers.AutoTokenizer.from_pretrained(source).save_pretrained(path)
        except (OSError, ValueError):  # --init-from without a tokenizer: the weights alone
            pass
    log(f"trained weights: {path} (from_pretrained loads it)")


# --- LoRA's frozen base (a Hugging Face checkpoint) ---
def build_base__pretrained(args, dtype):
    """LoRA's frozen base: --init-from DIR loads a save_pretrained directory with from_pretrained in ``dtype`` (16
    bits under bf16/fp16: what a pretrained base is trained on); without it the model is freshly initialised from
    its config (a smoke test: the adapters then learn on a random base). ``dtype`` None: as built (fp32)."""
    import transformers

    if not args.init_from:
        log("warning: no --init-from: the adapters train on a freshly initialised base (a smoke test, not a fine-tune)")
        model = build_model()
        if dtype is not None:  # the parameters only: buffers (rotary tables) stay as built, as from_pretrained does
            for p in model.parameters():
                if p.is_floating_point():
                    p.data = p.data.to(dtype)
        return model
    return pretrained(getattr(transformers, HF_MODEL_CLASS).from_pretrained, args.init_from,
                      dtype=dtype or torch.float32, attn_implementation=ATTN_IMPLEMENTATION)


def quantization_config(storage=torch.uint8):
    """bitsandbytes' storage of the frozen base (transformers' BitsAndBytesConfig): 4-bit QUANTIZE (nf4/fp4) with
    optional double quantization, computing in BNB_COMPUTE_DTYPE, the 4-bit codes packed into ``storage`` elements
    (bnb_4bit_quant_storage); or LLM.int8() (int8)."""
    import transformers

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[BNB_COMPUTE_DTYPE]
    if QUANTIZE == "int8":
        return transformers.BitsAndBytesConfig(load_in_8bit=True)
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANTIZE,
                                           bnb_4bit_use_double_quant=DOUBLE_QUANT, bnb_4bit_compute_dtype=compute,
                                           bnb_4bit_quant_storage=storage)


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


def no_cpu_repacking(model):
    """bitsandbytes' CPU inference layout off (CUDA never repacks): on a CPU with AVX512-bf16 an eval-mode forward (the
    held-out evaluation) repacks each 4-bit weight for a bf16 kernel (Linear4bit.forward ->
    _convert_weight_packed_for_cpu), whose matmul has no autograd kernel: every later step's gradients stop at it (grad
    norm 0), and under ZeRO-3 the partition keeps the old packing, which the next gather no longer matches."""
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
    return model


def load_quantized_base(path: str, device):
    """QLoRA's frozen base: from_pretrained with the BitsAndBytesConfig (the linear layers are quantized as they
    load, onto ``device``), then peft's prepare_model_for_kbit_training: every parameter frozen and the
    non-quantized ones (embeddings, norms, LM head) in fp32. Activation checkpointing is not turned on here (its
    use_gradient_checkpointing): the script enables it as every strategy does, non-reentrant, when it
    is on."""
    import peft
    import transformers

    model = pretrained(getattr(transformers, HF_MODEL_CLASS).from_pretrained, path,
                       quantization_config=quantization_config(), dtype=torch.float32, device_map={"": str(device)},
                       attn_implementation=ATTN_IMPLEMENTATION)
    return peft.prepare_model_for_kbit_training(no_cpu_repacking(model), use_gradient_checkpointing=False)


def build_base__quantized(args, dtype):
    """ZeRO-3's QLoRA base (--init-from, or the test base the script saved there), quantized as from_pretrained loads
    it, with its 4-bit codes packed into ``dtype`` elements (bnb_4bit_quant_storage): every parameter is then a float
    tensor of the module's dtype, which DeepSpeed's bf16/fp16 cast leaves bit-for-bit alone and ZeRO-3 partitions like
    any parameter in deepspeed.initialize. transformers builds a quantized model without zero.Init, so each rank loads
    the whole quantized base first, onto its own device (bitsandbytes' quantizer picks the current CUDA device, else
    the CPU; a device_map is refused while an HfDeepSpeedConfig is alive). Not prepare_model_for_kbit_training: its
    fp32 upcast of the other parameters would be cast back to 16 bits by DeepSpeed (trl skips it for sharded QLoRA)."""
    import transformers

    model = pretrained(getattr(transformers, HF_MODEL_CLASS).from_pretrained, args.init_from,
                       quantization_config=quantization_config(dtype), dtype=dtype,
                       attn_implementation=ATTN_IMPLEMENTATION)
    model.requires_grad_(False)  # the base frozen (peft adds the trainable adapters)
    return no_cpu_repacking(model)
