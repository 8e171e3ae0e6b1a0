import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule


class Classifier(TrainModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.cross_entropy(self.net(x), y))
        self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


g = torch.Generator().manual_seed(0)
x = torch.randn(96, 8, generator=g)
y = x[:, :3].argmax(1)                      # a learnable rule: the largest of the first three features
train_loader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16, shuffle=True)
val_loader = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=32)
model = Classifier()
