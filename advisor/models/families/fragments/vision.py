# --- The model (a torchvision classifier) and its data ---
INIT_FROM_HELP = ("pretrained weights to start from: a state_dict file (such as the model.pt this script writes) or "
                  "a torchvision weights name such as IMAGENET1K_V2 (downloaded); without it freshly initialised")
DATA_HELP = ("an ImageFolder tree (one sub-directory of images per class): DIR/train and DIR/val when both exist, "
             "else DIR with a seeded HELD_OUT_FRACTION of it held out for evaluation")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # what torchvision's weights expect


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


class LabelledImages(torch.utils.data.Dataset):
    """(image, class) pairs as the dicts the training loop reads."""

    def __init__(self, images) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        x, target = self.images[index]
        return {"x": x, "target": target}


def load_real_dataset(args):
    """(training, held-out) images from --data: a random resized crop and flip for training, a resize and centre
    crop for evaluation (the usual ImageNet transforms)."""
    from torchvision import datasets, transforms

    if not os.path.isdir(args.data):
        raise SystemExit(f"--data {args.data}: an image dataset is a directory (ImageFolder: one sub-directory per "
                         "class)")
    size = INPUT_SHAPE[-1]
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), normalize])
    eval_tf = transforms.Compose([transforms.Resize(size * 256 // 224), transforms.CenterCrop(size),
                                  transforms.ToTensor(), normalize])
    train_dir, val_dir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    try:
        return split_images(args, train_dir, val_dir, train_tf, eval_tf, datasets)
    except FileNotFoundError as err:  # ImageFolder: no class directory or no image in one
        raise SystemExit(f"--data {args.data}: {err}") from None


def split_images(args, train_dir: str, val_dir: str, train_tf, eval_tf, datasets):
    """(training images, held-out images): DIR/train and DIR/val, or a seeded split of DIR."""
    if os.path.isdir(train_dir) and os.path.isdir(val_dir):
        train, held_out = datasets.ImageFolder(train_dir, train_tf), datasets.ImageFolder(val_dir, eval_tf)
    else:
        train, held_out = datasets.ImageFolder(args.data, train_tf), datasets.ImageFolder(args.data, eval_tf)
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(DATA_SEED)).tolist()
        cut = max(1, round(len(order) * HELD_OUT_FRACTION))
        train, held_out = torch.utils.data.Subset(train, order[cut:]), torch.utils.data.Subset(held_out, order[:cut])
    classes = len(train.dataset.classes if isinstance(train, torch.utils.data.Subset) else train.classes)
    if classes > NUM_CLASSES:
        raise SystemExit(f"--data {args.data}: {classes} classes, the model has {NUM_CLASSES} outputs: replace its "
                         "classifier layer in build_model()")
    log(f"data: {len(train)} training and {len(held_out)} held-out images in {classes} classes")
    return LabelledImages(train), LabelledImages(held_out)


def compute_loss(model, batch: dict, device, dtype=None):
    """This rank's mean cross-entropy (a mean per rank: the gradients are averaged over the ranks)."""
    x = batch["x"].to(device, non_blocking=True)
    if dtype is not None:
        x = x.to(dtype)
    out = model(x)
    return torch.nn.functional.cross_entropy(out.float(), batch["target"].to(device, non_blocking=True))


# [full]
def export_weights(model, args, state_dict=None) -> None:
    """Rank 0: --out/model.pt, a state_dict without wrapper prefixes; ``state_dict``: what a sharded strategy
    gathered."""
    path = os.path.join(args.out, "model.pt")
    torch.save(model.state_dict() if state_dict is None else state_dict, path)
    log(f"trained weights: {path} (model.load_state_dict(torch.load(...)) on build_model())")
# [/full]
