# ---------------------------------------------------------------------------------------------
# The model (a torchvision classifier) and its data
# ---------------------------------------------------------------------------------------------
def build_model():
    """The model this script was generated for, freshly initialised (no download)."""
    import torchvision

    size = {"image_size": INPUT_SHAPE[-1]} if MODEL_NAME.startswith("vit_") else {}
    return torchvision.models.get_model(MODEL_NAME, weights=None, **size)


def make_sample(g: torch.Generator, index: int) -> dict:
    """One synthetic training sample: a random image of INPUT_SHAPE and one of 1000 classes."""
    x = torch.randn(INPUT_SHAPE, generator=g)
    return {"x": x, "target": torch.randint(0, 1000, (), generator=g), "index": index}


def compute_loss(model, batch: dict, device, dtype=None):
    """Forward pass and per-rank mean cross-entropy (pitfall 9: a mean per rank; DDP averages gradients)."""
    x = batch["x"].to(device, non_blocking=True)
    if dtype is not None:
        x = x.to(dtype)
    out = model(x)
    return torch.nn.functional.cross_entropy(out.float(), batch["target"].to(device, non_blocking=True))
