"""Datasets (digits, synthetic, image folders), their transforms, and the bad-sample-tolerant collate."""

from scaletrain.data.collate import BadSample, collate
from scaletrain.data.delay import DelayedDataset
from scaletrain.data.make_imagefolder import write_imagefolder
from scaletrain.data.registry import DataBundle, build_datasets, dataset_names, default_image_size

__all__ = ["BadSample", "DataBundle", "DelayedDataset", "build_datasets", "collate", "dataset_names", "default_image_size", "write_imagefolder"]
