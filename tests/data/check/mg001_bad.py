"""Single-process multi-GPU training with nn.DataParallel: GPU 0 gathers everything."""
import torch
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader


def main() -> None:
    dataset = torchvision.datasets.FakeData(size=1024, image_size=(3, 64, 64), num_classes=10,
                                            transform=torchvision.transforms.ToTensor())
    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=8)
    model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    model = nn.DataParallel(model).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(5):
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images.cuda()), labels.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")
    torch.save(model.module.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
