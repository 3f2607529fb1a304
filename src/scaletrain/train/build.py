"""What every process of a run builds alike: seeded RNGs, the datasets and the model."""

from __future__ import annotations

import random

import numpy as np
import torch

from scaletrain.config import TrainConfig
from scaletrain.data import build_datasets
from scaletrain.distributed.env import cache_dir
from scaletrain.models import build_model


def build_data_and_model(cfg: TrainConfig):
    """Datasets and the model, after seeding: the same initial weights in every process that calls it."""
    seed_everything(cfg.optim.seed)
    data = build_datasets(cfg.data.dataset, image_size=cfg.data.image_size, seed=cfg.optim.seed,
                          synthetic_samples=cfg.data.synthetic_samples,
                          synthetic_classes=cfg.data.synthetic_classes, augment=cfg.data.augment, cache=cache_dir())
    model = build_model(cfg.model.name, num_classes=data.num_classes, in_channels=data.in_channels,
                        image_size=data.image_size, stem=cfg.model.stem, width=cfg.model.width)
    return data, model


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
