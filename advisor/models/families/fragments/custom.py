# --- The model (your factory) and its data ---
INIT_FROM_HELP = "weights to start from: a state_dict file (such as the model.pt this script writes)"
DATA_HELP = "your data: write load_real_dataset() in this script first"


def build_model(init_from=None):
    """The model this script was generated for: your factory, called as advisor called it, with --init-from's
    state_dict loaded into it when given."""
    import importlib

    module_name, fn_name = MODEL_FACTORY.split(":")
    model = getattr(importlib.import_module(module_name), fn_name)()
    if init_from:
        model.load_state_dict(torch.load(init_from, map_location="cpu", weights_only=True))
    return model


def make_sample(g: torch.Generator) -> dict:
    """One synthetic training sample: a random float input of INPUT_SHAPE."""
    return {"x": torch.randn(INPUT_SHAPE, generator=g)}


def compute_loss(model, batch: dict, device, dtype=None):
    """Forward pass and the mean square of the output (a stand-in loss of the right size; use yours)."""
    x = batch["x"].to(device, non_blocking=True)
    if dtype is not None:
        x = x.to(dtype)
    out = model(x)
    out = out if not isinstance(out, (tuple, list)) else out[0]
    return out.float().pow(2).mean()


def load_real_dataset(args):
    """(training set, held-out set) of your data: map-style datasets of dicts with the keys make_sample()
    yields. advisor cannot know your model's data, so this is yours to write."""
    raise SystemExit(f"--data {args.data}: write load_real_dataset() in this script to read your data")


def export_weights(model, args, state_dict=None) -> None:
    """Rank 0: the trained weights, --out/model.pt (a state_dict without wrapper prefixes: build_model() loads it).
    ``state_dict``: the full weights when the strategy gathered them (sharded parameters)."""
    path = os.path.join(args.out, "model.pt")
    torch.save(model.state_dict() if state_dict is None else state_dict, path)
    log(f"trained weights: {path} (model.load_state_dict(torch.load(...)) on build_model())")
