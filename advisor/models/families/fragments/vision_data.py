"""The images train.py reads with --data: an ImageFolder tree (one sub-directory of images per class), DIR/train
and DIR/val when both exist, else DIR with a seeded share of it held out, with the usual ImageNet transforms.
train.py passes its constants in."""

import os

import torch

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # what torchvision's weights expect


class LabelledImages(torch.utils.data.Dataset):
    """(image, class) pairs as the dicts the training loop reads."""

    def __init__(self, images) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        x, target = self.images[index]
        return {"x": x, "target": target}


def image_folder(root: str, size: int, held_out_fraction: float, seed: int,
                 num_classes: int) -> tuple[LabelledImages, LabelledImages, str]:
    """(training images, held-out images, a line saying what was read) from --data ``root``: a random resized crop
    and flip for training, a resize and centre crop for evaluation, ``size`` pixels square."""
    from torchvision import datasets, transforms

    if not os.path.isdir(root):
        raise SystemExit(f"--data {root}: an image dataset is a directory (ImageFolder: one sub-directory per "
                         "class)")
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), normalize])
    eval_tf = transforms.Compose([transforms.Resize(size * 256 // 224), transforms.CenterCrop(size),
                                  transforms.ToTensor(), normalize])
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    try:
        if os.path.isdir(train_dir) and os.path.isdir(val_dir):
            train, held_out = datasets.ImageFolder(train_dir, train_tf), datasets.ImageFolder(val_dir, eval_tf)
        else:
            train, held_out = datasets.ImageFolder(root, train_tf), datasets.ImageFolder(root, eval_tf)
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
            cut = max(1, round(len(order) * held_out_fraction))
            train, held_out = torch.utils.data.Subset(train, order[cut:]), torch.utils.data.Subset(held_out, order[:cut])
    except FileNotFoundError as err:  # ImageFolder: no class directory or no image in one
        raise SystemExit(f"--data {root}: {err}") from None
    classes = len(train.dataset.classes if isinstance(train, torch.utils.data.Subset) else train.classes)
    if classes > num_classes:
        raise SystemExit(f"--data {root}: {classes} classes, the model has {num_classes} outputs: replace its "
                         "classifier layer in build_model()")
    said = f"data: {len(train)} training and {len(held_out)} held-out images in {classes} classes"
    return LabelledImages(train), LabelledImages(held_out), said
