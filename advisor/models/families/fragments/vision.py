# --- The model (a torchvision classifier) and its data ---
INIT_FROM_HELP = ("pretrained weights to start from: a state_dict file (such as the model.pt this script writes) or "
                  "a torchvision weights name such as IMAGENET1K_V2 (downloaded); without it freshly initialised")
DATA_HELP = ("an ImageFolder tree (one sub-directory of images per class): DIR/train and DIR/val when both exist, "
             "else DIR with a seeded HELD_OUT_FRACTION of it held out for evaluation")


def build_model(init_from=None):
    """--init-from's weights (a state_dict file, or a torchvision weights name), or freshly initialised."""
    import torchvision

    size = {"image_size": INPUT_SHAPE[-1]} if MODEL_NAME.startswith("vit_") else {}
    named = init_from if init_from and not os.path.isfile(init_from) else None
    model = torchvision.models.get_model(MODEL_NAME, weights=named, **size)
    if init_from and named is None:
        model.load_state_dict(torch.load(init_from, map_location="cpu", weights_only=True))
    return model


def make_sample(g: torch.Generator) -> dict:
    """A synthetic sample: a random image of INPUT_SHAPE and a class."""
    x = torch.randn(INPUT_SHAPE, generator=g)
    return {"x": x, "target": torch.randint(0, NUM_CLASSES, (), generator=g)}


def load_real_dataset(args):
    """(training, held-out) images from --data (data.py's ImageFolder reader, at the model's input size)."""
    train, held_out, said = data.image_folder(args.data, INPUT_SHAPE[-1], HELD_OUT_FRACTION, DATA_SEED, NUM_CLASSES)
    log(said)
    return train, held_out


def compute_loss(model, batch: dict, device, dtype=None):
    """This rank's mean cross-entropy (a mean per rank: the gradients are averaged over the ranks). In training
    GoogLeNet and Inception v3 also return their auxiliary classifiers' logits: those losses add at 0.3 each
    (GoogLeNet's paper, Szegedy et al. 2015, section 5)."""
    x = batch["x"].to(device, non_blocking=True)
    if dtype is not None:
        x = x.to(dtype)
    out, target = model(x), batch["target"].to(device, non_blocking=True)
    loss = torch.nn.functional.cross_entropy(getattr(out, "logits", out).float(), target)
    for aux in (getattr(out, name, None) for name in ("aux_logits", "aux_logits1", "aux_logits2")):
        if aux is not None:
            loss = loss + 0.3 * torch.nn.functional.cross_entropy(aux.float(), target)
    return loss


def export_weights(model, args, state_dict=None) -> None:
    """Rank 0: --out/model.pt, a state_dict without wrapper prefixes; ``state_dict``: what a sharded strategy
    gathered."""
    path = os.path.join(args.out, "model.pt")
    torch.save(model.state_dict() if state_dict is None else state_dict, path)
    log(f"trained weights: {path} (model.load_state_dict(torch.load(...)) on build_model())")
